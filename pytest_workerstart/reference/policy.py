"""``StartPolicy``: every decision the reference's iterator makes about its workers, in one place.

The iterator (:mod:`.iterator`) builds, starts, registers, watches and stops workers; at each
decision it asks its policy, one instance per iterator, made with
``loader.start_policy(loader)``. The defaults below are the reference's behaviour. A loader
that changes one decision subclasses the loader and sets ``start_policy`` to a subclass that
overrides that method, and nothing else; the broken loaders in ``fixtures/broken/`` are
written this way, each stating its one defect in a few lines. The iterator's own methods
are not an extension point.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from pytest_workerstart.reference.errors import clear_held_frames, name_unpicklable_argument
from pytest_workerstart.reference.launcher import Launcher, start_serially, stop_launches, worker_main


class StartPolicy:
    """The reference's decisions, in the order the iterator meets them."""

    #: the worker process's entry point, ``(driver token, torch worker-loop kwargs) -> None``
    worker_main = staticmethod(worker_main)

    def __init__(self, loader) -> None:
        # Weak: the loader holds its persistent iterator, which holds this policy; a strong
        # reference would make that a cycle, and the workers would outlive ``del loader``
        # until the cyclic gc ran. A ref, not a proxy: a dead proxy raises on isinstance(),
        # which breaks any scan of gc.get_objects() while a policy outlives its loader.
        self._loader = weakref.ref(loader)

    @property
    def loader(self):
        """The loader this policy's iterator belongs to (None once the loader is gone)."""
        return self._loader()

    # --- building ------------------------------------------------------------------

    def timeout(self, requested: float) -> float:
        """The timeout the iterator waits for a batch with (the loader's ``timeout``)."""
        return requested

    def prefetch_factor(self, requested: int) -> int:
        """Batches requested ahead per worker (the loader's ``prefetch_factor``)."""
        return requested

    def parallelism(self, method: str, num_workers: int) -> int:
        """Starts in flight at once: ``worker_start_parallelism`` capped at ``num_workers``;
        1 under fork (forking while start threads run is unsafe)."""
        return 1 if method == "fork" else min(self.loader.worker_start_parallelism, num_workers)

    def worker_kwargs(self, worker_id: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        """What worker ``worker_id``'s loop is given (torch's ``_worker_loop`` keywords:
        dataset, collate_fn, init_fn, base_seed, worker_id, num_workers, ...)."""
        return kwargs

    def built(self, worker_id: int, process) -> None:
        """Worker ``worker_id``'s process exists (not started); every worker is built before any starts."""

    # --- starting --------------------------------------------------------------------

    def start(self, workers: list, parallelism: int, first_batch_first: bool) -> Launcher | None:
        """Start ``workers`` in id order: with ``parallelism`` 1 serially, before ``iter()``
        returns (None); else a :class:`Launcher`, which the iterator begins: the start is deferred."""
        if parallelism > 1:
            return Launcher(workers, parallelism, first_batch_first=first_batch_first)
        start_serially(workers)
        return None

    def registration_order(self, num_workers: int) -> list[int]:
        """Which built worker takes each slot: worker-id order, whatever order the starts finish in."""
        return list(range(num_workers))

    def started(self, workers: list) -> None:
        """Every start has returned and the workers are registered."""

    # --- a failed start --------------------------------------------------------------

    def cleanup_failed_start(self, launches: list, done_event, exc: BaseException) -> None:
        """After a failed start (``exc``, Ctrl-C included): stop and join every started worker and
        close every queue of ``launches`` (``(index queue, process)`` pairs)."""
        stop_launches(launches, done_event)

    def forget(self, exc: BaseException, *lists: list) -> None:
        """Drop what a held ``exc`` would keep alive: frames and closures in its traceback
        still see these lists, so empty them, then clear the finished frames' locals."""
        for lst in lists:
            lst.clear()
        clear_held_frames(exc)

    def explain_start_error(self, exc: BaseException, sent: dict[str, Any], method: str) -> None:
        """Reword a start error caused by an argument in ``sent`` that does not pickle, naming it."""
        name_unpicklable_argument(exc, sent, method)

    # --- running and stopping ----------------------------------------------------------

    def watches_workers(self) -> bool:
        """Whether a worker's death is noticed: its pid registered with torch's SIGCHLD
        handler, and a liveness check while waiting for data."""
        return True

    def receive(self, get: Callable[[float], tuple[bool, Any]], timeout: float) -> tuple[bool, Any]:
        """Wait for the next result with ``get`` (the iterator's wait: a dead worker raises)."""
        return get(timeout)

    def received(self, batch):
        """A batch as the iterator hands it on (after torch's processing)."""
        return batch

    def failed(self, exc: BaseException, iterator) -> None:
        """``iterator``'s ``next()`` is about to raise ``exc`` (not ``StopIteration``)."""

    def shutdown(self, stop: Callable[[], None]) -> None:
        """Stop the workers (``stop``: torch's shutdown and the reference's own)."""
        stop()
