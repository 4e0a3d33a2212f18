"""Run a loader scenario in a fresh interpreter with a hard timeout.

``run_scenario("pkg.mod:func", {...}, timeout=60)`` starts
``python -m pytest_workerstart.harness.runner`` in a new session (so every
descendant, even one orphaned and re-parented to init, shares its session id),
calls ``func(**kwargs)`` there and returns a :class:`ScenarioResult`.

On timeout the parent asks faulthandler in the child for every thread's stack
(SIGUSR1), then kills the whole session (:func:`~pytest_workerstart.harness.reaper.kill_session`) and
reports ``hang`` with those stacks. A child that dies without a result is reported as ``crash``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from pytest_workerstart import space
from pytest_workerstart.harness import reaper, zygote
from pytest_workerstart.harness.cleanup import unlink_created_since, unlink_left
from pytest_workerstart.probes.deadline import GUARD_EVERY_S, memory_limit_bytes, tree_memory_over
from pytest_workerstart.probes.shm import ShmWatch, named_for

#: Set (in a thread of :mod:`pytest_workerstart.harness.lookahead`) to an event that, once set,
#: stops the scenario at its next poll: its tree is killed and ScenarioAborted raised.
ABORT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("workerstart_abort", default=None)


class ScenarioAborted(Exception):
    """The scenario was stopped before its end because nobody will read its result."""


def check_abort() -> None:
    event = ABORT.get()
    if event is not None and event.is_set():
        raise ScenarioAborted("stopped: the check that needed it no longer runs")


@dataclasses.dataclass
class ScenarioResult:
    status: str  # ok | error | hang | memory | crash
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    stacks: str | None = None
    returncode: int | None = None
    duration_s: float = 0.0
    stderr: str = ""
    leftovers: list[str] = dataclasses.field(default_factory=list)
    #: /dev/shm entries the scenario's tree created and left (unlinked by the runner)
    shm_left: list[str] = dataclasses.field(default_factory=list)
    #: torch's segments named for a process of the scenario's tree that died before unlinking them
    #: (unlinked by the runner; reported, not judged)
    shm_named: list[str] = dataclasses.field(default_factory=list)
    #: the points of the loaders the scenario built (:func:`pytest_workerstart.space.recording`)
    built: list[str] = dataclasses.field(default_factory=list)

    def one_line(self) -> str:
        if self.status == "ok":
            return "ok"
        if self.status == "error":
            return f"scenario raised {self.error}"
        if self.status == "hang":
            return f"hang: no result within {self.duration_s:.0f} s (killed; stacks of every thread attached)"
        if self.status == "memory":
            return f"memory: {self.error} (killed after {self.duration_s:.0f} s; stacks attached)"
        return f"crash: scenario process exited with {self.returncode} and no result"

    def details(self) -> str:
        parts = [self.one_line()]
        if self.traceback:
            parts.append(self.traceback)
        if self.stacks:
            parts.append("--- thread stacks (faulthandler) ---\n" + self.stacks)
        elif self.stderr.strip():
            parts.append("--- stderr (tail) ---\n" + self.stderr[-4000:])
        if self.leftovers:
            parts.append("--- left behind, killed by the runner ---\n" + "\n".join(self.leftovers))
        if self.shm_left:
            parts.append("--- /dev/shm entries left behind, unlinked by the runner ---\n" + "\n".join(self.shm_left))
        return "\n".join(parts)


def child_env() -> dict[str, str]:
    """The child must import what pytest could (rootdir/conftest sys.path entries)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}


def prestart_zygote() -> None:
    """Start the zygote now, in a thread, so that its import of torch overlaps this process's
    own (the suite's modules) instead of being waited for by the first warm scenario."""
    def start() -> None:
        try:
            zygote.get({**os.environ, **child_env()})
        except zygote.Refused:
            pass  # the first warm scenario asks again, or runs in a fresh interpreter

    threading.Thread(target=start, name="workerstart-zygote-start", daemon=True).start()


def launch(workdir: Path, target: str, kwargs: dict, env: dict[str, str] | None = None, *,
           warm: bool = False, fast_exit: bool = False) -> subprocess.Popen:
    """Start ``target(**kwargs)`` in a fresh interpreter in a new session (the one child launcher).

    The request goes to ``workdir/request.json``, the result (if any) to
    ``workdir/result.json``, stdout and stderr to ``workdir/stderr.txt``, and
    ``TMPDIR`` is ``workdir/tmp``. ``warm``: forked from the zygote, which has
    imported torch (:mod:`pytest_workerstart.harness.zygote`), where it can. ``fast_exit``:
    the child ends with ``os._exit`` once its result is written (a timed run whose
    interpreter teardown, about a second with torch loaded, nothing reads).
    """
    request = workdir / "request.json"
    request.write_text(json.dumps({"target": target, "kwargs": kwargs, "result": str(workdir / "result.json"),
                                   "fast_exit": fast_exit}))
    # Everything the scenario's tree puts in the temp directory (multiprocessing's
    # pymp-* with forkserver sockets, event logs) lives in workdir and goes with it,
    # also when the tree is killed before its own cleanup runs.
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    if warm:
        try:
            full_env = {**os.environ, **(env or {})}
            return zygote.get(full_env).fork(str(request), str(workdir / "stderr.txt"), str(tmp),
                                             full_env.get("PYTHONPATH", ""))
        except zygote.Refused:
            pass  # a fresh interpreter instead
    with open(workdir / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest_workerstart.harness.runner", str(request)],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
            env={**os.environ, **(env or {}), "TMPDIR": str(tmp)},
        )


def run_scenario(target: str, kwargs: dict | None = None, *, timeout: float = 120.0,
                 env: dict[str, str] | None = None, dump_grace: float = 2.0,
                 memory_limit: int | None = None, exit_grace: float = 0.0, measuring: bool = False,
                 warm: bool = False) -> ScenarioResult:
    """Run ``target(**kwargs)`` in a fresh interpreter; kill it and its tree after
    ``timeout`` s (status ``hang``, with stacks) or once their memory (PSS:
    :func:`~pytest_workerstart.probes.deadline.tree_memory_over`) passes ``memory_limit``
    bytes (default: half of this machine's; status ``memory``).
    ``/dev/shm`` entries its tree created and left are unlinked and listed in ``shm_left``
    (``measuring``: a timed run; the tree is then sampled once a second only, so
    that the watch costs the measurement nothing, and the child skips its
    interpreter's teardown once its result is written: see :func:`launch`).

    ``warm``: see :func:`launch`.

    ``exit_grace``: once the interpreter has exited, how long what it started
    (workers, a forkserver, the resource tracker, which prints its leak warnings
    then) may take to go by itself; only what is still there counts as ``leftovers``."""
    workdir = Path(tempfile.mkdtemp(prefix="workerstart-scenario-"))
    result_path = workdir / "result.json"
    err_path = workdir / "stderr.txt"
    proc = launch(workdir, target, kwargs or {}, env, warm=warm, fast_exit=measuring)
    start = time.monotonic()  # after a zygote's own start (bounded by it), which is not the scenario's
    leader_ctime = reaper.register_session(proc.pid)
    guard = tree_memory_over(memory_limit or memory_limit_bytes(None), root=proc.pid)
    shm = ShmWatch(interval=1.0 if measuring else 0.1, eager=not measuring, root=proc.pid,
                   # the session too: workers outlive a killed driver
                   also=lambda: [p.pid for p in reaper.session_members(proc.pid, leader_ctime)]).__enter__()
    stacks = None
    status = memory = None
    try:
        while status is None:
            try:
                proc.wait(timeout=min(GUARD_EVERY_S, max(timeout - (time.monotonic() - start), 0)))
                break
            except subprocess.TimeoutExpired:
                check_abort()
                memory = guard()
                if memory:
                    status = "memory"
                elif time.monotonic() - start >= timeout:
                    status = "hang"
    except BaseException:  # Ctrl-C, pytest-timeout or an abort while waiting: take the scenario down with us
        reaper.kill_session(proc.pid, leader_ctime=leader_ctime)
        reaper.wait_or_kill(proc)
        reaper.unregister_session(proc.pid)
        shm.__exit__(None, None, None)
        unlink_left(shm)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    if status is not None:
        try:
            proc.send_signal(signal.SIGUSR1)
            proc.wait(timeout=dump_grace)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    duration = time.monotonic() - start
    if status in ("hang", "memory"):
        stacks = err_path.read_text(errors="replace")[-20000:]
    elif exit_grace:
        deadline = time.monotonic() + exit_grace
        while reaper.session_members(proc.pid, leader_ctime) and time.monotonic() < deadline:
            time.sleep(0.1)
    leftovers = reaper.kill_session(proc.pid, leader_ctime=leader_ctime)
    shm.__exit__(None, None, None)
    reaper.wait_or_kill(proc)
    reaper.unregister_session(proc.pid)
    stderr = err_path.read_text(errors="replace")
    try:
        if status is None and result_path.exists():
            data = json.loads(result_path.read_text())
            res = ScenarioResult(status=data["status"], value=data.get("value"), error=data.get("error"),
                                 traceback=data.get("traceback"), built=data.get("built", []))
        else:
            res = ScenarioResult(status=status or "crash", stacks=stacks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if memory:
        res.error = memory
    res.returncode = proc.returncode
    res.duration_s = duration
    res.stderr = stderr
    res.leftovers = leftovers
    res.shm_left = unlink_left(shm)
    res.shm_named = unlink_created_since(shm.before, named_for(shm.pids, shm.before))
    return res


def _child_main(request_path: str) -> int:
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True, file=sys.stderr)
    # A scenario models an interactive driver: Ctrl-C raises KeyboardInterrupt even when
    # this process inherited SIGINT ignored (started from a background job of a script,
    # nohup, some CI runners), where Python leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    req = json.loads(Path(request_path).read_text())
    module_name, func_name = req["target"].split(":", 1)

    with space.recording() as built:
        try:
            func = getattr(importlib.import_module(module_name), func_name)
            value = func(**req["kwargs"])
            out = {"status": "ok", "value": value}
        except BaseException as exc:
            out = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                   "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}
    out["built"] = built
    tmp = req["result"] + ".tmp"
    Path(tmp).write_text(json.dumps(out, default=repr))
    os.replace(tmp, req["result"])
    sys.stdout.flush()
    sys.stderr.flush()
    if req.get("fast_exit"):
        os._exit(0)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        from pytest_workerstart.harness import zygote

        forked = zygote.main(sys.argv[2:])
        sys.exit(0 if forked is None else _child_main(forked["request"]))
    sys.exit(_child_main(sys.argv[1]))
