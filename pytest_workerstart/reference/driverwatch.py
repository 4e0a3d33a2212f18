"""Workers that exit when the process driving the loader dies.

torch's worker watchdog polls ``getppid()``. Under forkserver the parent is the
forkserver, not the driver, so after the driver is SIGKILLed the workers and the
forkserver wait for each other forever (each worker holds the forkserver's
"alive" pipe). Watching the *driver* breaks that cycle.

Mechanism: a daemon thread in each worker blocks in ``select`` on a pidfd of
the driver (Linux ≥ 5.3): no polling, no CPU. The driver's start time travels
with the pid and is compared on arrival, so a reused pid is never mistaken for
the driver. Without pidfd, the thread polls once a second instead.
"""

from __future__ import annotations

import os
import select
import threading
import time


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (/proc), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[19])


def driver_token() -> tuple[int, int | None]:
    """Identify the current process (the driver) robustly against pid reuse."""
    pid = os.getpid()
    return pid, process_start_ticks(pid)


def _gone(pid: int, ticks: int | None) -> bool:
    now = process_start_ticks(pid)
    return now is None or (ticks is not None and now != ticks)


def _watch(pid: int, ticks: int | None) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):
        fd = None
    if _gone(pid, ticks):  # died (or pid reused) before we looked
        os._exit(0)
    if fd is not None:
        select.select([fd], [], [])
        os._exit(0)
    while not _gone(pid, ticks):
        time.sleep(1.0)
    os._exit(0)


def watch_driver(token: tuple[int, int | None]) -> None:
    """In a worker: exit silently (``os._exit(0)``) as soon as the driver is gone."""
    pid, ticks = token
    if pid == os.getpid():
        return  # in-process (num_workers=0) use: nothing to watch
    threading.Thread(target=_watch, args=(pid, ticks), name="workerstart-driver-watch", daemon=True).start()
