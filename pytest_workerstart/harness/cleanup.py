"""Removing what a loader's tree left behind, and nothing else.

The probes say what is left (:mod:`pytest_workerstart.probes.leaks`); these act on
it. A process is killed only when its pid and start match what was
recorded of the tree under test; a ``/dev/shm`` entry is unlinked only when it was
attributed to that tree and still has the inode it had then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from pytest_workerstart.harness.reaper import kill_and_wait, wait_exited
from pytest_workerstart.probes.leaks import ProcInfo
from pytest_workerstart.probes.proc_start import started
from pytest_workerstart.probes.shm import ShmWatch, shm_entries

if TYPE_CHECKING:
    from pytest_workerstart.probes.context import InstrumentedContext


def share_temp_dir() -> str:
    """Give this process its multiprocessing temporary folder before any worker starts.

    A worker (fork, spawn or forkserver) inherits the folder of the process that created it,
    if it had one then; without it the worker makes its own ``pymp-*`` folder, which it removes
    only if it exits normally: torch's workers open a listener socket there to pass file
    descriptors, so each one the loader or the suite kills would leave a folder behind.
    The folder is removed when this process exits (multiprocessing's own finalizer)."""
    from multiprocessing import util

    return util.get_temp_dir()


def kill_tree(procs: Iterable[ProcInfo], timeout: float = 3.0) -> list[ProcInfo]:
    """Kill what is still alive among ``procs`` (create time must match)."""
    procs = list(procs)
    alive = []
    for info in procs:
        try:
            if started(info.pid) != info.started:
                continue  # gone, or pid reused: not ours
            p = psutil.Process(info.pid)
            p.kill()
            alive.append(p)
        except psutil.Error:
            continue
    wait_exited(alive, timeout)
    return [i for i in procs if i.pid in {p.pid for p in alive}]


def kill_workers(ctx: InstrumentedContext) -> list[int]:
    """SIGKILL the workers ``ctx`` started (and their children) and reap them; the pids killed."""
    victims = ctx.worker_tree()
    kill_and_wait(victims)
    return [v.pid for v in victims]


def unlink_created_since(before: dict[str, int], entries: dict[str, int]) -> list[str]:
    """Unlink those of ``entries`` (attributed to our tree, name -> inode) that still
    exist with that inode and did not exist so in ``before``; the names unlinked."""
    now = shm_entries()
    gone = []
    for name, ino in sorted(entries.items()):
        if now.get(name) == ino and before.get(name) != ino:
            try:
                os.unlink(f"/dev/shm/{name}")
                gone.append(name)
            except OSError:
                continue
    return gone


def unlink_left(watch: ShmWatch, semaphores: bool = True) -> list[str]:
    """Unlink what ``watch.left()`` reports (ours by attribution, never another job's); with
    ``semaphores=False`` not named semaphores, which a live driver may still hold (their
    finalizers unlink them, and the resource tracker what nobody did)."""
    seen = watch.seen if semaphores else {n: i for n, i in watch.seen.items() if not n.startswith("sem.")}
    return unlink_created_since(watch.before, seen)
