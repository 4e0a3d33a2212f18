"""Make sure ``pytest --workerstart`` leaves no process behind, even after Ctrl-C.

Scenario processes run in their own sessions and register here; checks that
run loaders in-process leave descendants of pytest itself. At session end (and
at interpreter exit, which still runs after KeyboardInterrupt) every registered
session and every non-helper descendant is killed. The resource tracker is
spared: it exits by itself once pytest is gone and unlinks what is left.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading

import psutil

_lock = threading.Lock()
_sessions: set[int] = set()
_installed = False


def register_session(sid: int) -> None:
    global _installed
    with _lock:
        _sessions.add(sid)
        if not _installed:
            atexit.register(reap_session)
            _installed = True


def unregister_session(sid: int) -> None:
    with _lock:
        _sessions.discard(sid)


def reap_session(timeout: float = 5.0) -> list[str]:
    """Kill registered scenario sessions and pytest's own worker descendants."""
    from pytest_workerstart.probes.scenario import kill_and_wait, kill_session

    lines: list[str] = []
    with _lock:
        sids = list(_sessions)
        _sessions.clear()
    for sid in sids:
        lines += kill_session(sid, timeout)
    victims = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if "multiprocessing.resource_tracker" in cmd:
                continue
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            lines.append(f"pid {child.pid} {cmd[:160]}")
            victims.append(child)
        except psutil.Error:
            continue
    # torch's SIGCHLD handler raises for a registered worker that we kill here
    # (an iterator the checks leaked): the reaper must not become a crash.
    with _sigchld_ignored():
        kill_and_wait(victims, timeout)
    return lines


@contextlib.contextmanager
def _sigchld_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, old)
