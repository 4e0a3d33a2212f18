"""A parent that imported torch once and forks one scenario interpreter per request.

Most of a correctness scenario's own cost is a fresh interpreter importing torch
(about 3 s of CPU here) before it builds anything. The zygote imports torch and the
suite's scenario modules once, then forks: the child is what the runner's fresh
interpreter would be, minus that import. It gets its own session (``setsid``, before
the runner hears of it), stdin from ``/dev/null``, stdout and stderr to the
scenario's file, its own ``TMPDIR``, default signal dispositions, and it ends
through the interpreter's normal exit (atexit handlers, multiprocessing's
finalizers), never ``os._exit``, with nothing frozen by then (as a fresh interpreter).
Its workers are started by the loader under test as usual (spawn workers are fresh
interpreters; a forkserver is the child's own).

``exit.clean_interpreter`` uses it too: what it judges comes from the child's own exit
(only torch's import-time output, not the loader's, would miss its stderr). The preflight
uses it too: its boot measurement adds the zygote's own import of torch, timed in a fresh
interpreter under this run's load (:func:`import_cost`). Not for the
``workerstart_clean_exit`` fixture (a user's
callable, fresh as documented) or the benchmark (fresh interpreters, as its tables say). The speed clause's
trials are forked from it: each is a fresh driver whose workers boot as usual, and no measured span
includes the driver's own import. The zygote runs no Python
thread and no torch operation: it refuses to fork (and the runner starts a fresh
interpreter) if its imports left a Python thread running.

It is ``python -m pytest_workerstart.harness.runner --zygote``: processes forked
from it carry the runner's command line, which the guard and the self-tests know.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from pytest_workerstart.harness import reaper
from pytest_workerstart.probes import leaks

#: imported once in the zygote (never the loader's own module: user code stays in the child)
PRELOAD = ("torch", "psutil", "pytest", "pytest_workerstart.scenarios", "pytest_workerstart.protocol",
           *(f"pytest_workerstart.conformance.{m}" for m in (  # the rooms' scenario modules
               "failure.child_faults", "failure.interrupt", "failure.forkserver_died", "failure.driver_death",
               "exit.clean_exit", "sharding.ranks")),
           "pytest_workerstart.session.preflight", "pytest_workerstart.harness.forkserver",
           "pytest_workerstart.probes.context", "pytest_workerstart.probes.leaks",
           "pytest_workerstart.probes.faults", "pytest_workerstart.datasets")
START_TIMEOUT_S = 120.0
#: what a fresh interpreter pays for the first preload: one spawn worker's boot
BOOT_MODULE = "torch.utils.data"
#: seconds this zygote spent importing BOOT_MODULE (set in the zygote, inherited by its children)
_import_s: float | None = None


# --- in the zygote -------------------------------------------------------------


def _threads() -> int:
    # Python threads only: numpy's OpenBLAS starts its pool at import and shuts it down
    # around fork() itself (pthread_atfork), as every fork-context DataLoader relies on.
    return threading.active_count()


def _say(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def serve(preload: list[str]) -> dict | None:
    """The zygote's loop. Returns only in a forked child, with its request."""
    global _import_s
    t0 = time.monotonic()
    importlib.import_module(BOOT_MODULE)
    _import_s = time.monotonic() - t0
    for name in preload:
        importlib.import_module(name)
    # What the imports made lives as long as every child: frozen, a child's gc.collect() (the
    # checks' scenarios call it after each loader) does not walk it, nor copy its pages.
    gc.freeze()
    _say({"ready": os.getpid(), "threads": _threads()})
    buf = b""
    while True:
        while True:  # reap, and say who ended with what status
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if not select.select([0], [], [], 0.1)[0]:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:  # the runner's side is gone: so are we (children live on in their sessions)
            return None
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            if _threads() != 1:
                _say({"id": req["id"], "refused": f"{_threads()} threads are running in the zygote"})
                continue
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                os.setsid()
                os.close(w)  # EOF tells the zygote the session exists
                return req
            os.close(w)
            os.read(r, 1)
            os.close(r)
            _say({"id": req["id"], "pid": pid})


def become_scenario(req: dict) -> None:
    """In the forked child: look like the runner's fresh interpreter."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(err, 1)
    os.dup2(err, 2)
    os.close(devnull)
    os.close(err)
    os.environ["TMPDIR"] = req["tmp"]
    tempfile.tempdir = None
    _take_pythonpath(req["pythonpath"])
    # A fresh interpreter has nothing frozen when it exits: what the zygote froze (its preloaded
    # modules' objects) is collectable again before teardown, so a loader held by one of those
    # modules is freed in the order a fresh interpreter frees it (the first handler registered
    # here: it runs after the scenario's own and before torch's and multiprocessing's).
    atexit.register(gc.unfreeze)


def _take_pythonpath(pythonpath: str) -> None:
    """Put the request's ``PYTHONPATH`` where a fresh interpreter started with it has it:
    after the script's directory, before the standard library (the zygote may have been
    started before pytest added the project's directories)."""
    started_with = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    wanted = [p for p in pythonpath.split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in started_with and p not in wanted]
    sys.path[1:] = [*wanted, *rest]
    os.environ["PYTHONPATH"] = pythonpath


def import_cost() -> float:
    """In a scenario forked from the zygote: the seconds its fresh import of torch took,
    which this process did not pay again; 0 in any other process."""
    return _import_s or 0.0


# --- in pytest -------------------------------------------------------------------


class Refused(Exception):
    """The zygote cannot fork a scenario (the runner then starts a fresh interpreter)."""


class WarmChild:
    """The part of :class:`subprocess.Popen` the runner uses, for a child of the zygote."""

    def __init__(self, zygote: Zygote, pid: int):
        self._zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"scenario pid {self.pid}", timeout)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self, env: dict[str, str]):
        self.key = _key(env)
        self._tmp = tempfile.mkdtemp(prefix="workerstart-zygote-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_workerstart.harness.runner", "--zygote", *PRELOAD],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            env={k: v for k, v in env.items() if k not in _PER_CALL} | {"TMPDIR": self._tmp}, bufsize=0)
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict] = {}
        self._next = 0
        self._gone = False
        self._ready = False
        threading.Thread(target=self._read, name="workerstart-zygote", daemon=True).start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._gone, START_TIMEOUT_S) or self._gone:
                self.close()
                raise Refused("the zygote did not start")

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "ready" in msg:
                    self._ready = True
                elif "exit" in msg:
                    self._exits[msg["exit"]] = msg["code"]
                else:
                    self._replies[msg["id"]] = msg
                self._cond.notify_all()
        self.proc.stdout.close()  # the zygote has exited (its scenarios write elsewhere): the reader owns the pipe
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    def fork(self, request: str, stderr: str, tmp: str, pythonpath: str) -> WarmChild:
        with self._cond:
            if self._gone:
                raise Refused("the zygote has exited")
            self._next += 1
            ident = self._next
            self.proc.stdin.write((json.dumps({"id": ident, "request": request, "stderr": stderr,
                                               "tmp": tmp, "pythonpath": pythonpath}) + "\n").encode())
            if not self._cond.wait_for(lambda: ident in self._replies or self._gone, 30) or ident not in self._replies:
                raise Refused("the zygote did not answer")
            reply = self._replies.pop(ident)
        if "refused" in reply:
            raise Refused(reply["refused"])
        return WarmChild(self, reply["pid"])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                if self._gone:  # nobody left to reap it: judge by the pid alone
                    return _orphan_code(pid)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left if left is None else min(left, 0.5))
            return self._exits[pid]

    def close(self) -> None:
        with self._cond:  # never while fork() writes a request
            self._gone = True
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        reaper.wait_or_kill(self.proc)
        shutil.rmtree(self._tmp, ignore_errors=True)


def _orphan_code(pid: int) -> int | None:
    import psutil

    try:
        return None if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else -signal.SIGKILL
    except psutil.Error:
        return -signal.SIGKILL  # its status went with the zygote; it is gone


#: set per child (TMPDIR) or by pytest for every test phase: not what tells environments apart
_PER_CALL = ("TMPDIR", "PYTEST_CURRENT_TEST")
#: also given per child (pytest adds the project's directories while it collects, after the
#: zygote may have started), but the zygote starts with it too: its preloads may need it
_PER_CHILD = ("PYTHONPATH",)


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CALL + _PER_CHILD))


_lock = threading.Lock()
_current: Zygote | None = None
_atexit = False


def get(env: dict[str, str]) -> Zygote:
    """The zygote for this environment (one at a time: another environment replaces it)."""
    global _current, _atexit
    with _lock:
        if _current is not None and (_current.key != _key(env) or _current.proc.poll() is not None):
            _current.close()
            _current = None
        if _current is None:
            if not _atexit:  # before it starts: an exit while it imports still stops it
                atexit.register(shutdown)
                _atexit = True
            _current = Zygote(env)
        return _current


def pipe_fds() -> set[int]:
    """This process's ends of the zygote's pipes (helper fds, never a loader's leak)."""
    z = _current
    if z is None:
        return set()
    out = set()
    for f in (z.proc.stdin, z.proc.stdout):
        try:
            out.add(f.fileno())
        except (ValueError, OSError):
            pass
    return out


def zygote_pid() -> set[int]:
    """The zygote's pid (a helper process, never a loader's leak)."""
    return {_current.proc.pid} if _current is not None else set()


leaks.HELPER_FD_SOURCES.append(pipe_fds)
leaks.HELPER_PID_SOURCES.append(zygote_pid)


def shutdown() -> None:
    """Stop the zygote (its children, in their own sessions, are the runner's)."""
    global _current
    with _lock:
        if _current is not None:
            _current.close()
            _current = None


def main(preload: list[str]) -> dict | None:
    """``runner --zygote``: serve; in a forked child, the request it is to run."""
    req = serve(preload)
    if req is not None:
        become_scenario(req)
    return req
