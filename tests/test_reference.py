"""The reference loader: validation, parity with torch DataLoader, failure cleanup."""

import gc
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from pytest_workerstart import _torch_internals
from pytest_workerstart.datasets import AugmentedDataset, NestedMapDataset, ShardedRange, WorkerTagDataset
from pytest_workerstart.harness.forkserver import warm_forkserver
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.digest import batch_digest
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.probes.leaks import LeakSnapshot
from pytest_workerstart.reference import ParallelStartDataLoader, WorkerStartError

# torch DataLoaders run in this process: their SIGCHLD handler and worker pids go with each test
pytestmark = pytest.mark.usefixtures("torch_process_state")


@pytest.fixture(scope="module", autouse=True)
def _forkserver():
    warm_forkserver()


def test_torch_internals_supported():
    _torch_internals.check_supported()  # fails loudly on an unsupported torch


def test_worker_waits_for_its_result_feeder_on_shutdown_only(monkeypatch):
    """A worker ending on shutdown lets the result queue's feeder finish (bounded) before its
    interpreter finalizes: a feeder still in torch's C++ then aborts the process under spawn."""
    import threading

    finished = []

    def loop(done_event, **_):
        def feed():
            time.sleep(0.3)
            finished.append(True)

        threading.Thread(target=feed, name="QueueFeederThread", daemon=True).start()

    monkeypatch.setattr(_torch_internals._utils.worker, "_worker_loop", loop)
    done = threading.Event()
    _torch_internals.run_worker_loop({"done_event": done})
    assert not finished  # not shutting down: multiprocessing joins the feeder itself
    time.sleep(0.4)
    finished.clear()
    done.set()
    t0 = time.monotonic()
    _torch_internals.run_worker_loop({"done_event": done})
    assert finished and time.monotonic() - t0 < _torch_internals.FEEDER_PATIENCE_S


def test_torch_internals_reject_other_versions():
    with pytest.raises(_torch_internals.UnsupportedTorchError, match="supports torch"):
        _torch_internals.check_supported("2.99.0")
    with pytest.raises(_torch_internals.UnsupportedTorchError):
        _torch_internals.check_supported("2.3.1")


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (True, TypeError), (1.5, TypeError),
                                      ("2", TypeError), (None, TypeError)])
def test_parallelism_validation(bad, exc):
    with pytest.raises(exc, match="worker_start_parallelism"):
        ParallelStartDataLoader(WorkerTagDataset(4), num_workers=2, worker_start_parallelism=bad)


def test_signature_is_torch_plus_its_own_keywords():
    import inspect

    torch_params = list(inspect.signature(DataLoader.__init__).parameters)
    ours = list(inspect.signature(ParallelStartDataLoader.__init__).parameters)
    assert ours == torch_params + ["worker_start_parallelism", "private_forkserver", "preload"]


@pytest.mark.parametrize("kw, match", [({"private_forkserver": 1}, "private_forkserver"),
                                       ({"private_forkserver": None}, "private_forkserver"),
                                       ({"preload": "numpy"}, "preload"), ({"preload": [1]}, "preload"),
                                       ({"preload": ["numpy", ""]}, "preload"), ({"preload": 3}, "preload")])
def test_forkserver_keyword_validation(kw, match):
    with pytest.raises(TypeError, match=match):
        ParallelStartDataLoader(WorkerTagDataset(4), num_workers=2, **kw)


def _all(loader):
    return [batch_digest(b) for b in loader]


def _pair(ds, ctx="forkserver", **kw):
    theirs = _all(DataLoader(ds, multiprocessing_context=ctx, generator=torch.Generator().manual_seed(5), **kw))
    ours = _all(ParallelStartDataLoader(ds, multiprocessing_context=ctx, generator=torch.Generator().manual_seed(5),
                                        worker_start_parallelism=kw.get("num_workers", 1), **kw))
    return theirs, ours


@pytest.mark.parametrize("kw", [
    dict(num_workers=3, batch_size=4, shuffle=True),
    dict(num_workers=2, batch_size=3, in_order=False),
    dict(num_workers=2, batch_size=4, pin_memory=True),
    dict(num_workers=3, batch_size=2, prefetch_factor=1),
], ids=["shuffle", "out_of_order", "pin_memory", "prefetch1"])
def test_parity_map(kw):
    theirs, ours = _pair(NestedMapDataset(24), **kw)
    if kw.get("in_order") is False:
        theirs, ours = sorted(theirs), sorted(ours)
    assert ours == theirs


def test_parity_iterable():
    theirs, ours = _pair(ShardedRange(30), num_workers=3, batch_size=4)
    assert ours == theirs


def test_parity_augmentation_and_seeds():
    theirs, ours = _pair(AugmentedDataset(16), num_workers=4, batch_size=2, shuffle=True)
    assert ours == theirs


def test_parity_persistent_second_epoch():
    ds = AugmentedDataset(12)
    a = DataLoader(ds, num_workers=2, batch_size=3, persistent_workers=True, multiprocessing_context="forkserver",
                   generator=torch.Generator().manual_seed(1))
    b = ParallelStartDataLoader(ds, num_workers=2, batch_size=3, persistent_workers=True,
                                multiprocessing_context="forkserver", generator=torch.Generator().manual_seed(1),
                                worker_start_parallelism=2)
    assert [_all(a) for _ in range(2)] == [_all(b) for _ in range(2)]


def _take(loader, n):
    it = iter(loader)
    for _ in range(n):
        next(it)


def test_failed_start_cleans_up_and_names_worker():
    before = LeakSnapshot.take()
    ctx = InstrumentedContext("forkserver", num_workers=4, faults=FaultPlan.start_error(2))
    loader = ParallelStartDataLoader(WorkerTagDataset(8), num_workers=4, multiprocessing_context=ctx,
                                     worker_start_parallelism=4)
    # Deferred start: raised by the first next() that sees it, at the latest
    # the one that needs worker 2 (batch 2).
    with pytest.raises(WorkerStartError, match="worker 2 ") as excinfo:
        _take(loader, 3)
    assert isinstance(excinfo.value.__cause__, OSError)
    # strict: nothing, not even an fd or semaphore, while the exception is held
    held = LeakSnapshot.wait_clean(before, timeout=10)
    assert not held, held.format()
    del excinfo
    ctx.begin_generation()
    assert len(list(loader)) == 8


def test_fork_stays_serial():
    ctx = InstrumentedContext("fork", num_workers=3, hold_for_overlap=0.3)
    list(ParallelStartDataLoader(WorkerTagDataset(6), num_workers=3, multiprocessing_context=ctx,
                                 worker_start_parallelism=3))
    assert ctx.peak_concurrent_starts() == 1


def test_parallelism_is_capped_at_num_workers():
    ctx = InstrumentedContext("forkserver", num_workers=2, hold_for_overlap=1.0)
    list(ParallelStartDataLoader(WorkerTagDataset(4), num_workers=2, multiprocessing_context=ctx,
                                 worker_start_parallelism=8))
    assert ctx.peak_concurrent_starts() == 2


def test_worker_error_releases_workers_promptly():
    """A held worker exception: collecting the iterator does not wait 5 s per worker."""
    import time

    loader = ParallelStartDataLoader(WorkerTagDataset(12), num_workers=3, batch_size=2,
                                     multiprocessing_context="forkserver", worker_start_parallelism=3,
                                     worker_init_fn=FaultPlan.worker_init_fn(1))
    box = []
    try:
        list(loader)
    except Exception as exc:
        box.append(exc)
    assert box
    t0 = time.monotonic()
    box.clear()
    gc.collect()
    assert time.monotonic() - t0 < 3.0


def test_deferred_start_first_batch_does_not_wait_for_later_workers(tmp_path):
    """p > 1: iter() returns while starts run; batch 0 needs only worker 0 (worker 3's start
    is held until the first batch has arrived)."""
    gate = tmp_path / "open"
    ctx = InstrumentedContext("forkserver", num_workers=4, faults=FaultPlan.start_gate(3, str(gate)))
    loader = ParallelStartDataLoader(WorkerTagDataset(16), num_workers=4, multiprocessing_context=ctx,
                                     worker_start_parallelism=2, batch_size=2)
    t0 = time.monotonic()
    it = iter(loader)
    first = next(it)
    assert ctx.records(0)[3].start_end is None, (
        f"the first batch waited for the last worker's start ({time.monotonic() - t0:.1f} s)")
    assert first["worker"].tolist() == [0, 0]
    gate.touch()
    rest = [b["index"].tolist() for b in it]
    assert [first["index"].tolist()] + rest == [[i, i + 1] for i in range(0, 16, 2)]


def test_serial_start_is_eager_like_torch():
    ctx = InstrumentedContext("forkserver", num_workers=3)
    it = iter(ParallelStartDataLoader(WorkerTagDataset(6), num_workers=3, multiprocessing_context=ctx))
    assert all(r.start_end is not None for r in ctx.records(0)), "p=1 must start every worker before iter() returns"
    assert len(list(it)) == 6


def test_early_break_while_starts_run_leaves_nothing():
    before = LeakSnapshot.take()
    ctx = InstrumentedContext("forkserver", num_workers=4, faults=FaultPlan.start_delay({2: 1.0, 3: 2.0}))
    loader = ParallelStartDataLoader(WorkerTagDataset(16), num_workers=4, multiprocessing_context=ctx,
                                     worker_start_parallelism=2)
    it = iter(loader)
    next(it)
    del it  # workers 2 and 3 are still starting: they are finished, stopped and joined
    gc.collect()
    leaked = LeakSnapshot.wait_clean(before, timeout=15)
    assert not leaked, leaked.format()


def test_private_attribute_drift_is_caught(monkeypatch):
    """A torch whose iterator __init__ assigns an attribute the reference does not is unsupported."""
    monkeypatch.setattr(_torch_internals, "ITER_STATE", _torch_internals.ITER_STATE - {"_in_order"})
    with pytest.raises(_torch_internals.UnsupportedTorchError, match="_in_order"):
        _torch_internals.check_supported()


def test_resolving_the_reference_checks_torch(monkeypatch):
    from pytest_workerstart import protocol

    monkeypatch.setattr(_torch_internals, "SUPPORTED_TORCH", ((2, 99), (3, 0)))
    with pytest.raises(protocol.SpecError, match="built-in loader 'reference': .*supports torch >=2.99"):
        protocol.resolve("reference")


def _feeders() -> set[int]:
    import threading

    return {t.ident for t in threading.enumerate() if t.name == "QueueFeederThread" and t.is_alive()}


def test_shutdown_returns_after_the_index_queues_feeders_ended():
    """A feeder still ending when the interpreter exits is stopped mid-finalizer as a daemon
    thread, and its queue's semaphore stays registered (the resource tracker's leak warning)."""
    before = _feeders()
    loader = ParallelStartDataLoader(WorkerTagDataset(16), num_workers=2, multiprocessing_context="fork")
    for _batch in loader:
        break  # the iterator goes here: its shutdown has returned on the next line
    assert _feeders() - before == set()


def test_what_workers_unpickle_is_held_outside_cycles_until_shutdown():
    """An iterator collected with a held error dies in the cyclic gc, whose weakref finalizers
    would unlink these semaphores before its shutdown (a spawn worker still booting then fails
    to unpickle them): the registry keeps them reachable until the shutdown has run."""
    from pytest_workerstart.reference import launcher as reference

    loader = ParallelStartDataLoader(WorkerTagDataset(8), num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    queues, result_queue, done_event = reference.LIVE_IPC[id(it)]
    assert queues == it._index_queues and result_queue is it._worker_result_queue
    assert done_event is it._workers_done_event
    del it, queues, result_queue, done_event
    gc.collect()
    assert reference.LIVE_IPC == {}


def test_a_start_policy_changes_one_decision_and_nothing_else():
    """The extension point (docs/reference.md, "Changing one decision"): a loader's
    ``start_policy`` subclass is asked each decision; overriding one leaves the others as they were."""
    from pytest_workerstart.reference import StartPolicy

    asked = []

    class AtMostTwo(StartPolicy):
        def parallelism(self, method, num_workers):
            asked.append(("parallelism", super().parallelism(method, num_workers)))
            return 2

        def started(self, workers):
            asked.append(("started", len(workers)))

    class Loader(ParallelStartDataLoader):
        start_policy = AtMostTwo

    ctx = torch.multiprocessing.get_context("forkserver")
    dl = Loader(list(range(12)), batch_size=2, num_workers=4, worker_start_parallelism=4, multiprocessing_context=ctx)
    it = iter(dl)
    assert it._pending is not None and it._pending.parallelism == 2
    assert [b.tolist() for b in it] == [[2 * i, 2 * i + 1] for i in range(6)]
    assert asked == [("parallelism", 4), ("started", 4)]


def test_dropping_a_persistent_loader_stops_its_workers_without_the_cyclic_gc():
    """The loader holds its persistent iterator, which holds its policy: the policy must not
    hold the loader, or ``del loader`` leaves the workers running until gc.collect()."""
    ctx = torch.multiprocessing.get_context("forkserver")
    dl = ParallelStartDataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True,
                                 worker_start_parallelism=2, multiprocessing_context=ctx)
    assert len(list(dl)) == 4
    workers = list(dl._iterator._workers)
    gc.disable()
    try:
        del dl
        for w in workers:
            w.join(10)
        assert all(w.exitcode is not None for w in workers), "workers outlived the loader"
    finally:
        gc.enable()


def test_a_policy_that_outlives_its_loader_breaks_no_scan_of_the_heap():
    """A policy kept alive after its loader is gone (a timer, a post-mortem list) must not
    make ``isinstance`` over ``gc.get_objects()`` raise (a dead weakref proxy would)."""
    dl = ParallelStartDataLoader(list(range(4)), num_workers=0)
    from pytest_workerstart.reference import StartPolicy

    kept = StartPolicy(dl)
    del dl
    gc.collect()
    assert kept.loader is None
    with warnings.catch_warnings():  # the heap holds torch.distributed's deprecated reduce_op, which warns when read
        warnings.simplefilter("ignore", FutureWarning)
        assert not any(isinstance(o, ParallelStartDataLoader) for o in gc.get_objects())
