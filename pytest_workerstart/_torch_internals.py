"""Every use of torch's private DataLoader internals, in one module.

Checked against torch 2.14.1 (the pinned version): :func:`check_supported` runs
whenever the ``reference`` loader is resolved (an unsupported torch is then a
one-line usage error) and in ``tests/test_reference.py``. It covers the version
range, ``_worker_loop``'s parameters, the signal-handling helpers, the inherited
methods, and every private iterator attribute torch assigns that the reference
must assign too or reads (``ITER_STATE``, ``BASE_STATE``, ``RESET_STATE``).
torch has no hook around worker creation, so the reference loader re-implements
``_MultiProcessingDataLoaderIter.__init__`` (its own code, not a copy) and relies on:

* ``_BaseDataLoaderIter.__init__`` and the inherited ``_reset``, ``_next_data``,
  ``_try_get_data``, ``_get_data``, ``_shutdown_workers`` and ``__del__`` of
  ``_MultiProcessingDataLoaderIter``, which read the attributes set below;
* ``_utils.worker._worker_loop``, called by keyword (its parameter names are
  checked by :func:`check_supported`);
* ``_utils.pin_memory._pin_memory_loop`` and ``_utils.signal_handling``;
* ``_utils.MP_STATUS_CHECK_INTERVAL`` and ``dataloader._sharding_worker_init_fn``;
* for resume: ``DataLoader._index_sampler`` (the property every iterator reads its
  sampler from, once, in ``_BaseDataLoaderIter.__init__``) and
  ``_SingleProcessDataLoaderIter`` (subclassed to count delivered batches).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import queue
import signal
import sys
import threading
import time

import torch
from torch.utils.data import _utils
from torch.utils.data import dataloader as _dl
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

#: Inclusive lower / exclusive upper bound of torch versions this module supports.
SUPPORTED_TORCH = ((2, 14), (2, 15))

WORKER_LOOP_PARAMS = (
    "dataset_kind", "dataset_holder", "index_queue", "data_queue", "done_event", "auto_collation",
    "collate_fn", "drop_last", "base_seed", "init_fn", "worker_id", "num_workers",
    "persistent_workers", "shared_seed",
)

#: What torch's own ``_MultiProcessingDataLoaderIter.__init__`` assigns (the
#: reference re-implements it and must assign the same: the inherited methods
#: read them). A torch that assigns anything else is not supported.
ITER_STATE = frozenset({
    "_data_queue", "_in_order", "_index_queues", "_pin_memory_thread", "_pin_memory_thread_done_event",
    "_prefetch_factor", "_shutdown", "_worker_init_fn", "_worker_pids_set", "_worker_result_queue", "_workers",
    "_workers_done_event", "daemon",
})
#: What ``_BaseDataLoaderIter.__init__`` must assign: the reference reads these.
BASE_STATE = frozenset({
    "_auto_collation", "_base_seed", "_collate_fn", "_dataset", "_dataset_kind", "_drop_last", "_num_workers",
    "_persistent_workers", "_pin_memory", "_pin_memory_device", "_rank", "_shared_seed", "_timeout", "_world_size",
})
#: Set by the inherited ``_reset`` and read by the reference.
RESET_STATE = frozenset({"_workers_status", "_task_info", "_rcvd_idx", "_tasks_outstanding"})

BaseIter = _dl._BaseDataLoaderIter
MultiProcessingIter = _dl._MultiProcessingDataLoaderIter
SingleProcessIter = _dl._SingleProcessDataLoaderIter
MP_STATUS_CHECK_INTERVAL = _utils.MP_STATUS_CHECK_INTERVAL


class UnsupportedTorchError(RuntimeError):
    pass


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _assigned(func) -> set[str]:
    """Attribute names ``func`` assigns (``self.x = ...``), from its bytecode."""
    import dis

    return {i.argval for i in dis.get_instructions(func) if i.opname == "STORE_ATTR"}


def check_supported(version: str | None = None) -> None:
    """Raise :class:`UnsupportedTorchError` unless torch's internals are as expected.

    Called whenever the ``reference`` loader is resolved (so an unsupported
    torch is a one-line usage error, not a wrong verdict) and by a self-test.
    """
    version = version or torch.__version__
    lo, hi = SUPPORTED_TORCH
    if not (lo <= _version_tuple(version) < hi):
        raise UnsupportedTorchError(
            f"pytest_workerstart's reference loader supports torch >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}; "
            f"found {version}. Its private DataLoader internals may differ.")
    params = tuple(inspect.signature(_utils.worker._worker_loop).parameters)
    if params != WORKER_LOOP_PARAMS:
        raise UnsupportedTorchError(f"torch {version}: _worker_loop parameters changed: {params}")
    for name in ("_set_worker_pids", "_remove_worker_pids", "_set_SIGCHLD_handler", "_error_if_any_worker_fails",
                 "_SIGCHLD_handler_set"):
        if not hasattr(_utils.signal_handling, name):
            raise UnsupportedTorchError(f"torch {version}: _utils.signal_handling.{name} is missing")
    for name in ("_reset", "_try_get_data", "_get_data", "_shutdown_workers", "_next_data",
                 "_register_persistent_workers_atexit", "_mark_worker_as_unavailable", "_process_data"):
        if not hasattr(MultiProcessingIter, name):
            raise UnsupportedTorchError(f"torch {version}: _MultiProcessingDataLoaderIter.{name} is missing")
    extra = _assigned(MultiProcessingIter.__init__) - ITER_STATE
    if extra:
        raise UnsupportedTorchError(f"torch {version}: _MultiProcessingDataLoaderIter.__init__ sets "
                                    f"{sorted(extra)}, which the reference loader does not")
    it = BaseIter(_dl.DataLoader(range(2), generator=torch.Generator().manual_seed(1234)))
    if it._base_seed != torch_worker_seeds(1234, 1)[0]:
        raise UnsupportedTorchError(f"torch {version}: worker seeds are no longer the generator's first draw")
    if not isinstance(vars(_dl.DataLoader).get("_index_sampler"), property):
        raise UnsupportedTorchError(f"torch {version}: DataLoader._index_sampler is no longer a property")
    for func, needed in ((BaseIter.__init__, BASE_STATE | {"_index_sampler"}),
                         (MultiProcessingIter._reset, RESET_STATE),
                         (BaseIter._reset, {"_sampler_iter"})):
        missing = needed - _assigned(func)
        if missing:
            raise UnsupportedTorchError(f"torch {version}: {func.__qualname__} no longer sets {sorted(missing)}")


class SkipFirst:
    """An index sampler whose next iteration that is drawn from starts ``skip`` steps
    in (a resumed epoch); every later one is whole (persistent workers' next epochs)."""

    def __init__(self, sampler, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        # lazily: torch's iterator calls iter() in __init__ and again in _reset, and
        # draws only from the second; the skip belongs to the iteration drawn from
        it = iter(self.sampler)
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            if next(it, _END) is _END:
                return
        yield from it

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


_END = object()


def resumable_index_sampler(skip_attr: str) -> property:
    """A ``DataLoader._index_sampler`` override: torch's, skipping ``getattr(loader,
    skip_attr)`` batches in the next iteration when that is non-zero."""

    def get(loader):
        sampler = _dl.DataLoader._index_sampler.fget(loader)
        skip = getattr(loader, skip_attr)
        return SkipFirst(sampler, skip) if skip else sampler

    return property(get)


def torch_worker_seeds(generator_seed: int, num_workers: int) -> dict[int, int]:
    """The seed torch gives each worker for a loader whose generator was seeded with
    ``generator_seed`` (sequential sampler): ``base_seed + worker_id``, ``base_seed``
    being the iterator's first draw from that generator. :func:`check_supported`
    verifies this against torch's own iterator."""
    g = torch.Generator().manual_seed(generator_seed)
    base = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
    return {w: base + w for w in range(num_workers)}


def worker_init_fn_for(it, loader):
    """torch wraps worker_init_fn for DataPipes so that workers shard them."""
    init_fn = loader.worker_init_fn
    if isinstance(it._dataset, (IterDataPipe, MapDataPipe)):
        init_fn = functools.partial(_dl._sharding_worker_init_fn, init_fn, it._world_size, it._rank)
    return init_fn


def worker_loop_kwargs(it, worker_id: int, index_queue) -> dict:
    """Keyword arguments of ``_worker_loop`` for ``worker_id`` of iterator ``it``."""
    return dict(
        dataset_kind=it._dataset_kind,
        # 2.14 pops the dataset from a holder so the Process does not retain it.
        dataset_holder=[it._dataset],
        index_queue=index_queue,
        data_queue=it._worker_result_queue,
        done_event=it._workers_done_event,
        auto_collation=it._auto_collation,
        collate_fn=it._collate_fn,
        drop_last=it._drop_last,
        base_seed=it._base_seed,
        init_fn=it._worker_init_fn,
        worker_id=worker_id,
        num_workers=it._num_workers,
        persistent_workers=it._persistent_workers,
        shared_seed=it._shared_seed,
    )


#: how long a worker that ends waits for its result queue's feeder thread (see run_worker_loop)
FEEDER_PATIENCE_S = 2.0


def run_worker_loop(kwargs: dict) -> None:
    """torch's worker loop, then a bounded wait for the feeder thread of the result queue.

    When the loop ends on shutdown it cancels that queue's join, so a feeder still pickling
    the last batch (``THPStorage_shareFd``, the GIL released) can meet the interpreter's
    finalization: under spawn the worker then aborts on stderr, "terminate called without an
    active exception" (the pattern of pytorch #117762; seen after ``for b in loader: break``
    on a loaded machine). A feeder blocked on a full pipe is not waited for past the bound.
    """
    _utils.worker._worker_loop(**kwargs)
    if kwargs["done_event"].is_set():
        deadline = time.monotonic() + FEEDER_PATIENCE_S
        for t in threading.enumerate():
            if t.name == "QueueFeederThread":  # CPython's name for multiprocessing queues' feeders
                t.join(max(0.0, deadline - time.monotonic()))


def start_pin_memory_thread(it) -> None:
    """Same arrangement as torch: a thread moves batches from workers to pinned memory."""
    it._pin_memory_thread_done_event = threading.Event()
    it._data_queue = queue.Queue()
    thread = threading.Thread(
        target=_utils.pin_memory._pin_memory_loop,
        args=(it._worker_result_queue, it._data_queue, torch.accelerator.current_device_index(),
              it._pin_memory_thread_done_event, it._pin_memory_device),
        daemon=True,
    )
    thread.start()
    it._pin_memory_thread = thread


def register_worker_pids(it) -> None:
    """Let torch's SIGCHLD handler report a dead worker instead of hanging."""
    _utils.signal_handling._set_worker_pids(id(it), tuple(w.pid for w in it._workers))
    _utils.signal_handling._set_SIGCHLD_handler()
    it._worker_pids_set = True
    # A worker that died before its pid was registered sent its SIGCHLD too early.
    _utils.signal_handling._error_if_any_worker_fails()


def unregister_worker_pids(it) -> None:
    if getattr(it, "_worker_pids_set", False):
        _utils.signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False


@contextlib.contextmanager
def process_state_restored():
    """On exit, torch's process-wide DataLoader state is as it was on entry.

    A DataLoader with workers installs torch's SIGCHLD handler once per process and
    registers its workers' pids in a table that handler reads. An iterator that outlives
    its caller (held by a traceback's frames, say) keeps its pids registered: the next
    SIGCHLD, from any child, then raises its workers' error wherever the main thread is,
    in someone else's code. On exit this collects such iterators, drops the pids still
    registered since entry, and puts back the SIGCHLD handler and torch's note that it set
    one. Yields the set of iterator keys registered since entry (for reports).
    """
    import gc

    handling = _utils.signal_handling
    set_pids, remove_pids = handling._set_worker_pids, handling._remove_worker_pids
    live: set[int] = set()

    def recording_set(key, pids):
        set_pids(key, pids)
        live.add(key)

    def recording_remove(key):
        live.discard(key)
        remove_pids(key)

    handler, handler_set = signal.getsignal(signal.SIGCHLD), handling._SIGCHLD_handler_set
    handling._set_worker_pids, handling._remove_worker_pids = recording_set, recording_remove
    try:
        yield live
    finally:
        gc.collect()  # iterators in reference cycles shut down (and unregister) here
        handling._set_worker_pids, handling._remove_worker_pids = set_pids, remove_pids
        for key in live:
            remove_pids(key)
        signal.signal(signal.SIGCHLD, handler)
        handling._SIGCHLD_handler_set = handler_set


def sigchld_note() -> bool | None:
    """Whether torch notes its SIGCHLD handler as installed (None: torch's data package not imported)."""
    if "torch.utils.data" not in sys.modules:
        return None
    from torch.utils.data._utils import signal_handling

    return signal_handling._SIGCHLD_handler_set


def set_sigchld_note(value: bool | None) -> None:
    """Put back what :func:`sigchld_note` returned (None: nothing to put back)."""
    if value is not None:
        from torch.utils.data._utils import signal_handling

        signal_handling._SIGCHLD_handler_set = value


def forget_killed_workers(pids: set[int]) -> int:
    """Take the iterators whose workers the suite killed out of torch's SIGCHLD table.

    An iterator still alive keeps its workers' pids registered; once the suite killed them,
    the next SIGCHLD from any child would raise their deaths wherever the main thread is (in
    a later check). Returns how many iterators were taken out."""
    import gc

    forgotten = 0
    for obj in gc.get_objects():
        if isinstance(obj, MultiProcessingIter) and getattr(obj, "_worker_pids_set", False):
            if {w.pid for w in getattr(obj, "_workers", ())} & pids:
                unregister_worker_pids(obj)
                forgotten += 1
    return forgotten
