"""How many cores this process may count on: for a user choosing a start parallelism (the
reference loader re-exports it), and for the probes and checks that scale with the machine.

A module of its own, importing nothing of the package: the reference loader and the
instruments that judge it both use it without importing each other.
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
