"""Tiny stdlib multiprocessing programs with known answers, for probe self-tests."""

import os
import threading
import time


def sleeper(seconds=30.0):
    time.sleep(seconds)


def quick():
    pass


def start_with_threads(ctx, n, parallelism, target=quick):
    """Build n processes, then start them from ``parallelism`` threads; join all."""
    procs = [ctx.Process(target=target, daemon=True) for _ in range(n)]
    it = iter(range(n))
    lock = threading.Lock()

    def run():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            procs[i].start()

    threads = [threading.Thread(target=run) for _ in range(parallelism)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join()
    return procs


def hang_forever():
    while True:
        time.sleep(3600)


def returns_42():
    return 42


def raises():
    raise ValueError("scenario failed on purpose")


def exits_hard():
    os._exit(7)


def interrupt_at_worker_1():
    """Serial starts with an interrupt fault at worker 1: which starts happened?"""
    from pytest_workerstart.probes.context import InstrumentedContext
    from pytest_workerstart.probes.faults import FaultPlan

    ctx = InstrumentedContext("fork", num_workers=3, faults=FaultPlan.interrupt(1))
    procs = [ctx.Process(target=quick) for _ in range(3)]
    started = []
    try:
        for i, p in enumerate(procs):
            p.start()
            started.append(i)
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    else:
        outcome = "no interrupt"
    for p in procs:
        if p.pid is not None:
            p.join()
    return {"outcome": outcome, "started": started}


_CHURN = r'''
import collections, json, multiprocessing, os, sys, time
from multiprocessing.synchronize import Semaphore
ctx = multiprocessing.get_context("spawn")
stop, out = sys.argv[1], sys.argv[2]
held = collections.deque()
created = lost = 0
while not os.path.exists(stop):
    held.append(Semaphore(1, ctx=ctx))
    created += 1
    if len(held) > 8:
        old = held.popleft()
        if not os.path.exists("/dev/shm/sem." + old._semlock.name.lstrip("/")):
            lost += 1
        del old
    time.sleep(0.005)
for s in held:
    if not os.path.exists("/dev/shm/sem." + s._semlock.name.lstrip("/")):
        lost += 1
json.dump({"created": created, "lost": lost}, open(out, "w"))
'''


class SemaphoreChurner:
    """A neighbour job: creates and unlinks named semaphores until stopped.

    ``report`` after the block: how many it created and how many of its own,
    still held, had vanished from /dev/shm (someone else unlinked them).
    """

    def __init__(self, report_path):
        self.report_path = str(report_path)
        self.stop_path = self.report_path + ".stop"
        self.report = None

    def __enter__(self):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", _CHURN, self.stop_path, self.report_path])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        import json

        open(self.stop_path, "w").close()
        self.proc.wait(timeout=30)
        with open(self.report_path) as f:
            self.report = json.load(f)
        return False


def leave_untracked_segment(path, keep_s=0.2):
    """Create a shared-memory block, take it off the resource tracker, keep it mapped
    ``keep_s`` seconds, close it without unlinking: it outlives this process."""
    from multiprocessing import resource_tracker, shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")
    with open(path, "w") as f:
        f.write(seg.name)
    time.sleep(keep_s)
    seg.close()


def whoami():
    """What a scenario interpreter looks like from inside (tests/test_zygote.py)."""
    import gc
    import signal
    import sys
    import tempfile

    return {"pid": os.getpid(), "sid": os.getsid(0), "tmpdir": tempfile.gettempdir(),
            "torch_loaded": "torch" in sys.modules, "gc_frozen": gc.get_freeze_count(),
            "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigchld_default": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
            "stdin": os.readlink("/proc/self/fd/0")}


def path_and_import(module):
    """``sys.path`` and where ``module`` is imported from (tests/test_zygote.py)."""
    import importlib
    import sys

    return {"path": sys.path, "file": importlib.import_module(module).__file__,
            "pythonpath": os.environ.get("PYTHONPATH", "")}


def says_at_exit(text):
    """Prints ``text`` on stderr from an atexit handler: only a normal interpreter exit runs it."""
    import atexit
    import sys

    atexit.register(lambda: print(text, file=sys.stderr))
    print("on stdout", flush=True)


def forkserver_tree_then_hang(path):
    """A stdlib forkserver with one child, then hang; ``path`` gets each process of the tree
    as ``[pid, start]`` once it is up. Every child of a forkserver holds the server's alive
    pipe, so the tree outlives its driver: only a kill ends it."""
    import json
    import multiprocessing

    import psutil

    from pytest_workerstart.probes.proc_start import started

    child = multiprocessing.get_context("forkserver").Process(target=sleeper, args=(3600,), daemon=True)
    child.start()
    tree = [[p.pid, started(p.pid)] for p in psutil.Process().children(recursive=True)]
    with open(f"{path}.tmp", "w") as f:
        json.dump(tree, f)
    os.replace(f"{path}.tmp", path)
    hang_forever()


def driver_with_orphan(ready_path, go_path, orphan):
    """A driver whose one child outlives it (tests/test_failure_waits.py): ``busy`` uses the CPU
    for 4 s after the driver died, then exits; ``idle`` sleeps for 10 minutes."""
    import subprocess
    import sys

    code = {"busy": ("import os, time\nwhile os.getppid() != 1 and os.getppid() == {ppid}: time.sleep(0.05)\n"
                     "end = time.monotonic() + 4\nwhile time.monotonic() < end: pass\n"),
            "idle": "import time\ntime.sleep(600)\n"}[orphan].replace("{ppid}", str(os.getpid()))
    subprocess.Popen([sys.executable, "-c", code])
    with open(ready_path, "w") as f:
        f.write("{}")
    time.sleep(600)
