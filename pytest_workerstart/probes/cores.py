"""How many cores the timing probe (and a user choosing a start parallelism) may count on.

Its own module so that the reference loader can use it without importing the
rest of the timing probe (which drives loaders through the protocol).
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on: a good ``worker_start_parallelism`` under spawn.

    More concurrent spawn boots than cores only share the CPU, so worker 0,
    which the first batch needs, boots later (see docs/benchmark.md)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
