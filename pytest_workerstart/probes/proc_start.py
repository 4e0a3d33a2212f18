"""When a process started, on a clock that no change of the wall clock moves.

A pid alone names a process only until it is reused, so whatever the suite records to kill
later is a pid and its start. psutil's ``create_time()`` is the start since boot plus
``btime`` from ``/proc/stat``, which Linux recomputes from the wall clock on every read: a
step of the wall clock (a VM's clock set on resume) moves every process's create time at
once, and a process recorded before the step no longer matches itself after it, so it
would be spared as "someone else". The start in clock ticks since boot never changes;
psutil's own identity check (``Process.is_running``) compares it too.
"""

from __future__ import annotations

import os
import time

import psutil

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: without ``/proc`` (not Linux) both clocks fall back to the wall clock (:func:`_fallback`)
_PROC = os.path.isdir("/proc/self")


def started(pid: int) -> float | None:
    """Seconds since boot at which ``pid`` started (:func:`now`'s clock); None if it is gone."""
    if not _PROC:
        return _fallback(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count from the last ")"
    return int(stat[stat.rindex(b")") + 2:].split()[19]) / _TICKS


def now() -> float:
    """Seconds since boot, on the clock :func:`started` counts in."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _PROC else time.time()


def _fallback(pid: int) -> float | None:
    """Without ``/proc`` (not Linux): psutil's create time, on the wall clock."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
