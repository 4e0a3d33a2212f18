"""The suite's use of multiprocessing's own forkserver: one preload list, started once per process."""

from __future__ import annotations

import multiprocessing

#: Modules the forkserver imports once, so forked workers boot in milliseconds.
#: Explicit names: the implicit ``__main__`` preload differs across Python
#: versions (cpython#126631) and the suite must not depend on it.
FORKSERVER_PRELOAD = ["torch", "torch.utils.data", "pytest_workerstart.datasets",
                      "pytest_workerstart.parity_data",
                      "pytest_workerstart.reference", "pytest_workerstart.probes.context"]

_preloaded = False


def warm_forkserver(start: bool = True) -> None:
    """Set the preload list before multiprocessing's forkserver first starts, then (with
    ``start``) start it and the resource tracker, once per process.

    ``start=False`` (scenario interpreters): the server starts when a loader first
    uses it, and a loader with a forkserver of its own never pays for this one. Its
    fds and process are a helper's either way (:func:`pytest_workerstart.probes.leaks.helper_fds`).
    """
    global _preloaded
    from multiprocessing import forkserver, resource_tracker

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    if _preloaded or not start:
        return
    forkserver.ensure_running()
    resource_tracker.ensure_running()
    _preloaded = True
