"""Nothing the suite started outlives it, and nothing else is ever killed.

Three layers:

* :func:`kill_session` / :func:`kill_and_wait`: the kill helpers every runner
  uses. A scenario runs in its own session; its members are found by session
  id, and a session id whose leader pid was reused by another process (the
  leader started at another time) is not ours.
* :func:`reap_session`: at session end (and at interpreter exit, which still
  runs after KeyboardInterrupt) every registered scenario session and every
  non-helper descendant of pytest that the session started is killed (a process
  that runs pytest in-process, ``pytest.main``, keeps the children it had).
* The guard (:func:`start_guard`): a small process in a session of its own
  that watches pytest (pidfd, else polling). While pytest lives it records
  pytest's descendants (pid + start time) and the scenario sessions among
  them; when pytest dies, whether by SIGTERM, SIGKILL or a crash, it kills
  what it recorded and is still the same process, then exits. Neither kills a
  descendant that existed when the guard started (the session's start). This covers
  what no code in a dead pytest can.

The resource tracker is always killed last, after a grace period: once every
holder of its pipe is gone it unlinks the semaphores they leaked, which a
SIGKILLed tracker would leave in ``/dev/shm``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil

from pytest_workerstart.probes.proc_start import started

TRACKER_MARKER = "multiprocessing.resource_tracker"
GUARD_MARKER = "pytest_workerstart.harness.reaper"
RUNNER_MARKER = "pytest_workerstart.harness.runner"

_lock = threading.Lock()
_sessions: dict[int, float | None] = {}  # sid -> leader create time
_installed = False
_guard: subprocess.Popen | None = None
#: (pid, start) of this process's descendants when the session started: not the session's
_preexisting: set[tuple[int, float | None]] = set()


# --- kill helpers ----------------------------------------------------------------


def _exited(p: psutil.Process) -> bool:
    """Gone, or a zombie: dead, holding nothing but its pid until its parent reaps it, and an
    orphan's parent is init, which here took up to two seconds to."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def session_members(sid: int, leader_ctime: float | None = None) -> list[psutil.Process]:
    """Live processes of session ``sid`` (Linux), never this process nor a zombie.

    With ``leader_ctime`` (the leader's :func:`~pytest_workerstart.probes.proc_start.started`):
    if pid ``sid`` now belongs to a newer process, the session id was reused; only members
    older than that process are ours.
    """
    newer_than = None
    if leader_ctime is not None:
        now = started(sid)
        if now is not None and now != leader_ctime:
            newer_than = now
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or os.getsid(p.pid) != sid:
                continue
            if newer_than is not None and _not_older_than(p.pid, newer_than):
                continue
            if _exited(p):
                continue
            out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def _not_older_than(pid: int, start: float) -> bool:
    """Gone, or started no earlier than ``start``: not a member of the session that ended."""
    began = started(pid)
    return began is None or began >= start


def wait_exited(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each of ``procs`` has exited (:func:`_exited`), reaping this process's own
    children; returns those still running after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    alive = list(procs)
    while True:
        still = []
        for p in alive:
            try:
                if p.ppid() == os.getpid():
                    p.wait(0)  # our child: reaped here, or still running
                    continue
            except psutil.TimeoutExpired:
                still.append(p)
                continue
            except psutil.Error:
                pass
            if not _exited(p):
                still.append(p)
        alive = still
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def kill_and_wait(procs: list[psutil.Process], timeout: float = 5.0) -> None:
    """SIGKILL ``procs`` (already-gone ones are fine) and wait until they have exited."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    wait_exited(procs, timeout)


def _is_tracker(p: psutil.Process) -> bool:
    try:
        return TRACKER_MARKER in " ".join(p.cmdline())
    except psutil.Error:
        return False


def kill_trackers_last(procs: list[psutil.Process], timeout: float = 5.0) -> None:
    """Kill ``procs``; resource trackers get ``timeout`` to exit by themselves first."""
    trackers = [p for p in procs if _is_tracker(p)]
    kill_and_wait([p for p in procs if p not in trackers], timeout)
    kill_and_wait(wait_exited(trackers, timeout), timeout)


def kill_session(sid: int, timeout: float = 5.0, leader_ctime: float | None = None) -> list[str]:
    """Kill every process of session ``sid``; return a line per victim."""
    members = session_members(sid, leader_ctime)
    lines = []
    for p in members:
        try:
            lines.append(f"pid {p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            continue
    kill_trackers_last(members, timeout)
    return lines


# --- session end -------------------------------------------------------------------


def register_session(sid: int) -> float | None:
    """Remember scenario session ``sid`` until it is unregistered; returns its leader's start
    (:func:`~pytest_workerstart.probes.proc_start.started`)."""
    global _installed
    ctime = started(sid)
    with _lock:
        _sessions[sid] = ctime
        if not _installed:
            atexit.register(reap_session)
            _installed = True
    return ctime


def unregister_session(sid: int) -> None:
    with _lock:
        _sessions.pop(sid, None)


def reap_session(timeout: float = 5.0) -> list[str]:
    """Kill registered scenario sessions and pytest's own worker descendants."""
    lines: list[str] = []
    with _lock:
        sids = list(_sessions.items())
        _sessions.clear()
    for sid, ctime in sids:
        lines += kill_session(sid, timeout, ctime)
    guard = _guard.pid if _guard is not None else None
    victims = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if TRACKER_MARKER in cmd or child.pid == guard or child.status() == psutil.STATUS_ZOMBIE \
                    or (child.pid, started(child.pid)) in _preexisting:
                continue
            lines.append(f"pid {child.pid} {cmd[:160]}")
            victims.append(child)
        except psutil.Error:
            continue
    # torch's SIGCHLD handler raises for a registered worker that we kill here
    # (an iterator the checks leaked): the reaper must not become a crash.
    with sigchld_ignored():
        kill_and_wait(victims, timeout)
    return lines


@contextlib.contextmanager
def sigchld_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, old)


class Terminated(KeyboardInterrupt):
    """pytest was sent SIGTERM: it unwinds as after Ctrl-C, running the cleanup of the step it
    was in and the fixtures' teardown; a second SIGTERM kills it (the guard cleans up then)."""


def terminate_as_interrupt(on_signal=None):
    """Make SIGTERM raise :class:`Terminated` in the main thread, where no one else handles it
    (a handler the user installed is kept). ``on_signal()`` runs first: the exception can be
    swallowed on its way (raised inside a ``__del__``), so the caller also asks the run to stop.
    Returns what :func:`restore_sigterm` puts back."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    owner = os.getpid()

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != owner:
            # a process forked from pytest (a fork worker before its own handlers are set, or
            # before multiprocessing's bootstrap): die as SIGTERM kills, never unwind through
            # pytest's frames as a second pytest
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if on_signal is not None:
            on_signal()
        raise Terminated("pytest was sent SIGTERM")

    signal.signal(signal.SIGTERM, handler)
    return handler


def restore_sigterm(handler) -> None:
    if handler is not None and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --- the guard -------------------------------------------------------------------------


def start_guard(verdict=None) -> subprocess.Popen:
    """Start (once per process) the guard that cleans up if this process dies.

    ``verdict``: the JSON verdict path; if this process dies before its final
    write, the guard records that in the file (see :func:`record_death`).
    """
    global _guard
    if _guard is None or _guard.poll() is not None:
        me = psutil.Process()
        _preexisting.clear()
        _preexisting.update(_descendants(me))
        args = [str(me.pid), repr(started(me.pid)), json.dumps(sorted(_preexisting))] + \
            ([str(verdict)] if verdict else [])
        _guard = subprocess.Popen([sys.executable, "-m", GUARD_MARKER, *args],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True, close_fds=True)
    return _guard


def wait_or_kill(proc, timeout: float = 5.0) -> None:
    """Collect a child's exit status (a ``Popen`` or what quacks like one): no zombie, and no
    running ``Popen`` dropped; SIGKILL if it has not exited within ``timeout``."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_guard() -> None:
    global _guard
    guard, _guard = _guard, None
    if guard is not None and guard.poll() is None:
        guard.terminate()
        wait_or_kill(guard)


def record_death(path: str) -> None:
    """pytest died before its final verdict write: say so in the file.

    The check that was running gets outcome ``error`` (the loader may have
    killed the process driving it); the others stay without outcome.
    """
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    if data.get("outcome") != "running":
        return  # pytest wrote its final verdict
    died_in = None
    for check in data.get("checks", []):
        if check.get("state") == "running":
            died_in = check["nodeid"]
            check.update(state="finished", outcome="error",
                         reason="pytest died while this check ran (the loader may have crashed the process driving "
                                "it); recorded by the workerstart guard")
    for check in data.get("checks", []):
        if check.get("state") == "not_run":
            check["reason"] = f"never ran: pytest died during {died_in}" if died_in else "never ran: pytest died"
    summary = dict.fromkeys(data.get("summary", {}), 0)
    for check in data.get("checks", []):
        key = check["outcome"] if check.get("state") == "finished" else "not_run"
        summary[key] = summary.get(key, 0) + 1
    data.update(outcome="incomplete", complete=False, summary=summary)
    tmp = f"{path}.guard.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def _descendants(p: psutil.Process) -> set[tuple[int, float | None]]:
    out = set()
    for child in p.children(recursive=True):
        try:
            out.add((child.pid, started(child.pid)))
        except psutil.Error:
            continue
    return out


def _guard_main(pid: int, ctime: float, not_ours: str = "[]", verdict: str | None = None,
                interval: float = 0.5) -> int:
    """Record ``pid``'s descendants until it dies, then kill what is left of them, but the
    ``not_ours`` (JSON [pid, start] pairs) that were running when the guard was started."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # pytest ended normally and stopped us
    try:
        watched = psutil.Process(pid)
        if started(pid) != ctime:
            return 0
    except psutil.Error:
        return 0
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    known: dict[tuple[int, float], psutil.Process] = {}
    spared = {(p, start) for p, start in json.loads(not_ours)}
    sessions: dict[int, float] = {}
    workdirs: set[str] = set()
    while True:
        try:
            for p in watched.children(recursive=True):
                if p.pid == os.getpid():
                    continue
                key = (p.pid, started(p.pid))
                if key[1] is None or key in spared:
                    continue
                if key not in known:
                    known[key] = p
                    if os.getsid(p.pid) == p.pid:  # a scenario session's leader
                        sessions[p.pid] = key[1]
                if p.pid in sessions:  # again each round: one forked by the zygote names its dir a moment later
                    workdirs.update(scenario_workdir(p))
        except (psutil.Error, OSError):
            pass
        if not watched.is_running():
            break
        if pidfd is not None:
            if select.select([pidfd], [], [], interval)[0]:
                break
        else:
            time.sleep(interval)
    victims = [p for p in known.values() if p.is_running()]  # is_running checks the start since boot
    for sid, leader in sessions.items():
        victims += [p for p in session_members(sid, leader) if p not in victims]
    kill_trackers_last(victims)
    for d in workdirs:
        shutil.rmtree(d, ignore_errors=True)
    if verdict:
        record_death(verdict)
    return 0


def scenario_workdir(p: psutil.Process) -> set[str]:
    """The private directory of a scenario leader: ``harness.runner DIR/request.json``, or
    one forked by the zygote (``harness.runner --zygote ...``), whose stderr is ``DIR/stderr.txt``."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return set()
    if RUNNER_MARKER not in cmd:
        return set()
    paths = [cmd[-1]]
    try:
        paths.append(os.readlink(f"/proc/{p.pid}/fd/2"))
    except OSError:
        pass
    for path in paths:
        d = os.path.dirname(path)
        if path.endswith(("request.json", "stderr.txt")) and \
                os.path.basename(d).startswith(("workerstart-scenario-", "workerstart-driver-")):
            return {d}
    return set()


if __name__ == "__main__":
    sys.exit(_guard_main(int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:5]))
