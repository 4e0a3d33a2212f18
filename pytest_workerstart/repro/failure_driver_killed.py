"""Standalone reproducer: processes a loader started outlive the process that drove it.

Contract clause ``failure.driver_killed`` (pytest-workerstart): when the process driving the
loader is killed (here: SIGKILL while its last worker is still starting, the other workers
started), every process it started (workers, a forkserver, the resource tracker) is gone within
15 s. The driver is this script run again with ``--driver``; its process tree is read from
/proc (Linux) before the kill. Needs only torch and the standard library.

    python failure_driver_killed.py                      # the loader this script was written for
    python failure_driver_killed.py mypkg.loaders:Loader [spawn|forkserver|fork]

Exits 1 (printing what it saw, then killing the survivors) if a process outlives the driver by
15 s, 0 otherwise.
"""

import importlib
import multiprocessing
import multiprocessing.context
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch
from torch.utils.data import Dataset

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data:DataLoader"
WORKERS = 2
BOUND_S = 15.0


class Items(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([i])


#: in the driver: the file that says the last start began, and the starts seen so far
STATE = {"ready_file": None, "calls": 0, "returned": 0}
LOCK = threading.Lock()


class LastStartHangs:
    """``start()`` of a worker process: the last one says ready once the others returned, then
    waits 10 minutes."""

    def start(self):
        with LOCK:
            STATE["calls"] += 1
            last = STATE["calls"] == WORKERS
        if last:
            deadline = time.monotonic() + 120
            while STATE["returned"] < WORKERS - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            with open(STATE["ready_file"], "w") as f:
                f.write("mid-start")
            time.sleep(600)
        super().start()
        with LOCK:
            STATE["returned"] += 1


# module level: spawn and forkserver pickle the process object, so its class must be importable
class LastStartHangsSpawnProcess(LastStartHangs, multiprocessing.context.SpawnProcess):
    pass


class LastStartHangsForkServerProcess(LastStartHangs, multiprocessing.context.ForkServerProcess):
    pass


class LastStartHangsForkProcess(LastStartHangs, multiprocessing.context.ForkProcess):
    pass


class LastStartHangsSpawnContext(multiprocessing.context.SpawnContext):
    Process = LastStartHangsSpawnProcess


class LastStartHangsForkServerContext(multiprocessing.context.ForkServerContext):
    Process = LastStartHangsForkServerProcess


class LastStartHangsForkContext(multiprocessing.context.ForkContext):
    Process = LastStartHangsForkProcess


CONTEXTS = {"spawn": LastStartHangsSpawnContext, "forkserver": LastStartHangsForkServerContext,
            "fork": LastStartHangsForkContext}


def drive(spec, context, ready_file):
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    STATE["ready_file"] = ready_file
    loader = loader_class(Items(), batch_size=2, num_workers=WORKERS, multiprocessing_context=CONTEXTS[context]())
    iter(loader)  # blocks in the last start until killed
    time.sleep(600)


def stat(pid):
    """(parent pid, session id, start time, state) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[3]), int(fields[19]), fields[0]


def tree(root):
    """(pid, start time) of ``root``'s descendants and of its session's members."""
    infos = {int(p): stat(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    infos = {p: s for p, s in infos.items() if s is not None}
    found, grew = {root}, True
    while grew:
        more = {p for p, s in infos.items() if s[0] in found or s[1] == root} - found
        found |= more
        grew = bool(more)
    return [(p, infos[p][2]) for p in found - {root}]


def alive(pid, started):
    s = stat(pid)
    return s is not None and s[2] == started and s[3] not in "ZX"


def main(spec: str, context: str) -> int:
    ready = os.path.join(tempfile.mkdtemp(), "ready")
    driver = subprocess.Popen([sys.executable, __file__, "--driver", spec, context, ready], start_new_session=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            print(f"the driver did not reach the last worker's start (exit status {driver.poll()})")
            return 2
        time.sleep(0.05)
    time.sleep(0.2)
    started = tree(driver.pid)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < BOUND_S:
        survivors = [(p, t) for p, t in started if alive(p, t)]
        if not survivors:
            print(f"ok: the {len(started)} processes the driver started were gone "
                  f"{time.monotonic() - killed_at:.1f} s after it was killed")
            return 0
        time.sleep(0.2)
    names = {pid: command_of(pid) for pid, _ in survivors}
    print(f"expected: nothing the driver started outlives it by {BOUND_S:.0f} s; observed {len(survivors)} of "
          f"{len(started)} still running (killed now): " + "; ".join(f"{p} {c[:120]}" for p, c in names.items()))
    # the workers first: the resource tracker then ends by itself and unlinks the semaphores they leave
    for pid, started_at in sorted(survivors, key=lambda s: "resource_tracker" in names[s[0]]):
        if "resource_tracker" in names[pid]:
            deadline = time.monotonic() + 10
            while alive(pid, started_at) and time.monotonic() < deadline:
                time.sleep(0.1)
        if alive(pid, started_at):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return 1


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        drive(*sys.argv[2:5])
    else:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER, sys.argv[2] if len(sys.argv) > 2 else "spawn"))
