"""``python -m pytest`` runs for the self-tests, forked from a server that has imported torch.

A self-test that runs the suite starts ``python -m pytest --workerstart ...``, and each such
interpreter first imports torch and pytest (about 2 s of CPU here, most of a small run's; the
self-test stage starts a few hundred). The server (tests/_warm_server.py, one per xdist worker,
started when the worker's session starts) has imported them once; each run is a fork of it
that takes the run's working directory, environment, PYTHONPATH and output files. A run's
process is then the server's child, not the test's: tests whose subject is the run's process
itself (its parent, its signals, its command line, what it imports) start a real subprocess
(``pytest.mark.cold_pytest`` for those that use pytester).

:func:`popen` stands in for ``subprocess.Popen`` of a pytest command line; anything else, or a
run while the server is busy with another, is a real subprocess.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("_warm_server.py")
#: how a command line runs pytest (pytester writes "-mpytest")
PYTEST_ARGV = ((sys.executable, "-m", "pytest"), (sys.executable, "-mpytest"))


#: how long a starting server may take to import torch (a busy machine at the stage's start)
START_TIMEOUT_S = 600.0


class Server:
    """One warm server, started on :meth:`start`; one run at a time, once it is ready."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.busy = threading.Lock()
        self.ready = threading.Event()
        self._settled = threading.Event()  # ready, or failed to start
        self.failure = ""  # why the server did not start, when it did not
        self._buffer = b""

    def start(self) -> None:
        """Start the server; it takes runs once it says it is ready (until then runs are real
        subprocesses), so a slow start delays nothing."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd="/", env=env)
        threading.Thread(target=self._await_ready, name="warm-server-start", daemon=True).start()

    def _await_ready(self) -> None:
        t0 = time.monotonic()
        try:
            said = self.read(START_TIMEOUT_S)
        except (OSError, ValueError):  # stopped while it started
            said = {}
        if "ready" in said:
            self.ready.set()
        else:
            self.failure = (f"did not say it was ready within {START_TIMEOUT_S:.0f} s" if self.proc.poll() is None
                            else f"exited with code {self.proc.returncode} after {time.monotonic() - t0:.0f} s")
        self._settled.set()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the server is ready, waiting while it starts (not once its start failed)."""
        self._settled.wait(timeout)
        return self.alive()

    def describe(self) -> str:
        if self.proc is None:
            return "not started"
        if self.failure:
            return self.failure
        if self.proc.poll() is not None:
            return f"exited with code {self.proc.returncode}"
        if not self.ready.is_set():
            return "starting"
        return "ready, busy with a run" if self.busy.locked() else "ready"

    def alive(self) -> bool:
        return self.ready.is_set() and self.proc is not None and self.proc.poll() is None

    def read(self, timeout: float | None) -> dict:
        """The server's next message; {} at the timeout or if the server ended."""
        end = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return {}
            chunk = os.read(fd, 4096)
            if not chunk:
                return {}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def request(self, message: dict) -> int | None:
        """Send a run; its pid, or None if the server did not take it."""
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            return None
        return self.read(60.0).get("pid")

    def stop(self) -> None:
        self.ready.clear()
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc = None


SERVER = Server()


class WarmRun:
    """The part of ``subprocess.Popen`` that pytester and the self-tests use, for a forked run."""

    stdin = None

    def __init__(self, server: Server, pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._collect(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _collect(self, timeout: float | None) -> None:
        message = self.server.read(timeout)
        if "exit" in message:
            self.returncode = message["exit"]
            self.server.busy.release()
        elif message or not self.server.alive():  # the server ended under the run
            self.returncode = -signal.SIGKILL
            self.server.busy.release()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _file_path(stream) -> str | None:
    name = getattr(stream, "name", None)
    return name if isinstance(name, str) and os.path.exists(name) else None


def popen(cmd, *, cwd=None, env=None, stdout=None, stderr=None, stdin=None, **kwargs):
    """``subprocess.Popen(cmd, ...)``, forked from the warm server when ``cmd`` is ``python -m pytest ...``
    with its output going to files (and stdin nothing); else a real subprocess."""
    cmd = [os.fspath(c) for c in cmd]
    argv = next((cmd[len(p):] for p in PYTEST_ARGV if tuple(cmd[:len(p)]) == p), None)
    out = _file_path(stdout)
    err = None if stderr == subprocess.STDOUT else _file_path(stderr)
    plain = (argv is not None and out is not None and (stderr == subprocess.STDOUT or err is not None)
             and stdin in (None, subprocess.DEVNULL, subprocess.PIPE) and not kwargs)
    if plain and SERVER.alive() and SERVER.busy.acquire(blocking=False):
        for stream in (stdout, stderr):
            if hasattr(stream, "flush"):
                stream.flush()
        pid = SERVER.request({"args": argv, "cwd": os.fspath(cwd or os.getcwd()),
                              "env": dict(os.environ if env is None else env), "stdout": out, "stderr": err})
        if pid is not None:
            return WarmRun(SERVER, pid, cmd)
        SERVER.busy.release()
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, stdin=stdin, **kwargs)


def run(cmd, *, timeout: float | None = None, **kwargs) -> int:
    """``subprocess.run(cmd, timeout=..., ...).returncode`` through :func:`popen` (output to files
    or DEVNULL); on the timeout the run is killed and ``subprocess.TimeoutExpired`` raised."""
    with open(os.devnull, "w") as null:
        kwargs = {"stdout": null, "stderr": subprocess.STDOUT, **kwargs}
        if kwargs["stdout"] is subprocess.DEVNULL:
            kwargs["stdout"] = null
        if kwargs["stderr"] is subprocess.DEVNULL:
            kwargs["stderr"] = null
        proc = popen(cmd, **kwargs)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
