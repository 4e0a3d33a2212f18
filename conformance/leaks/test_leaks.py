"""leaks.clean_exit: nothing is left after the ordinary ways an epoch ends.
leaks.fd_growth: open fds stay flat over many epochs.
leaks.shm_segments: no ``/dev/shm`` entry the loader's processes created outlives it.

Each way is its own case: full exhaustion, early ``break`` + ``del``, an
exception raised by the training loop itself, and persistent workers shut
down by deleting the loader. Batches are released before measuring: an fd
backing a batch the test still holds is not a leak. Processes and threads have
``--workerstart-exit-timeout`` (default 5 s) to go once the loader is done.
Exhaustion and early ``break`` are observed once per context for both
``leaks.clean_exit`` and ``leaks.shm_segments`` (:func:`_ordinary_ending`).
"""

import gc

import psutil
import pytest

from pytest_workerstart.checkenv import unlinked
from pytest_workerstart.datasets import CorruptItemDataset, WorkerTagDataset
from pytest_workerstart.harness.cleanup import unlink_left
from pytest_workerstart.probes.deadline import StepAborted
from pytest_workerstart.probes.leaks import LeakSnapshot
from pytest_workerstart.probes.shm import ShmWatch
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 2


class LoopError(Exception):
    pass


def _watch_shm(check_env, epoch) -> dict:
    """``epoch(ctx)`` builds a loader on ``ctx``, runs it and drops it, under a :class:`ShmWatch`:
    the ``/dev/shm`` entries its processes created, and those that outlive it (removed at once:
    never left on the machine)."""
    ctx = check_env.context(N)
    with ShmWatch() as watch:
        try:
            epoch(ctx)
            gc.collect()
        except BaseException as exc:  # stopped early (a bound, an interrupt): nothing it attributed stays either
            watch.note(ctx.shm_at_exit())
            gone = unlink_left(watch, semaphores=False)
            check_env.cleaned_shm.extend(gone)
            if gone and isinstance(exc, StepAborted):
                exc.add_cleanup(unlinked(gone))
            raise
    watch.note(ctx.shm_at_exit())
    left = watch.left(timeout=check_env.settings.exit_timeout)
    return {"shm_seen": sorted(watch.seen), "shm_left": left,
            "shm_unlinked": len(unlink_left(watch)) if left else 0}


def _ordinary_ending(check_env, ending: str) -> dict:
    """An epoch that ends by exhaustion or an early ``break`` (then ``del``), observed for both
    ids: its ``/dev/shm`` entries, and what the leak snapshot finds once the loader is gone."""
    def run() -> dict:
        before = check_env.snapshot()
        served = []

        def epoch(ctx) -> None:
            loader = check_env.make(WorkerTagDataset(16), num_workers=N, ctx=ctx, parallelism=check_env.parallelism(N))
            for i, _batch in enumerate(loader):
                served.append(i)
                if ending == "early_break" and i == 1:
                    break

        got = _watch_shm(check_env, epoch)
        report = LeakSnapshot.wait_clean(before, timeout=check_env.settings.exit_timeout)
        leaked = f"leaked {report.summary()}\n{report.format()}" if report else ""
        return {**got, "batches": len(served), "leaked": leaked}

    return check_env.observe(f"an epoch ended by {ending.replace('_', ' ')}", run)


@check("leaks.clean_exit", "nothing leaks after the ordinary ways an epoch ends")
@pytest.mark.parametrize("ending", ["exhaustion", "early_break", "loop_exception", "persistent_shutdown"])
def test_clean_exit(check_env, ending):
    """nothing leaks after exhaustion, early `break` + `del`, an exception in the training loop, persistent-workers
    shutdown (each reported separately); processes and threads have `--workerstart-exit-timeout` (default 5 s)
    to go

    Observed by: leak snapshots, polled up to the bound
    """
    if ending == "persistent_shutdown" and not check_env.loader.has("persistent_workers"):
        pytest.skip("loader does not declare capability 'persistent_workers'")
    if ending in ("exhaustion", "early_break"):
        got = _ordinary_ending(check_env, ending)
        if ending == "exhaustion":
            assert got["batches"] == 8
        if got["leaked"]:
            pytest.fail(f"after {ending.replace('_', ' ')}: {got['leaked']}", pytrace=False)
        return
    before = check_env.snapshot()
    p = check_env.parallelism(N)
    kw = {"persistent_workers": True} if ending == "persistent_shutdown" else {}
    loader = check_env.make(WorkerTagDataset(16), num_workers=N, parallelism=p, **kw)
    if ending == "loop_exception":
        with pytest.raises(LoopError):
            for i, batch in enumerate(loader):
                if i == 1:
                    raise LoopError("raised by the training loop")
        del batch
    else:
        for _epoch in range(2):
            for batch in loader:
                pass
        del batch
    del loader
    check_env.assert_clean(before, f"after {ending.replace('_', ' ')}", timeout=check_env.settings.exit_timeout)


EPOCHS = 20
#: fds a process may gain between the end of epoch 2 and the end of epoch 20
#: (epoch 1 opens what is opened once: the forkserver connection, torch's caches)
FD_ALLOWANCE = 2


def _num_fds(pid: int) -> int | None:
    try:
        return psutil.Process(pid).num_fds()
    except psutil.Error:
        return None


@check("leaks.fd_growth", "fds of the driver and of persistent workers stay flat over 20 epochs")
@pytest.mark.parametrize("iterators", ["persistent", "fresh"])
def test_fd_growth(check_env, iterators):
    """open fds of the driver, and with persistent workers of each worker, grow by at most ${FD_ALLOWANCE} between the
    end of epoch 2 and the end of epoch ${EPOCHS} (epoch 1 opens what is opened once); two cases: persistent
    workers, and a fresh iterator per epoch (driver only: its workers are gone; full profile only, and under
    forkserver and fork only: 40 spawn boots cost a minute, and an fd a spawn iterator leaks is already
    `leaks.clean_exit`'s, whose spawn cases diff the driver's fds). The per-epoch series is in the verdict JSON
    (`measurements.fds_per_epoch`)

    Observed by: `psutil` fd counts of the driver and of the worker pids the samples name, after each epoch with
    every batch released (pytorch #973, #11201)

    fds of the driver (and, with persistent workers, of each worker) after each of 20 epochs.
    """
    persistent = iterators == "persistent"
    if persistent and not check_env.loader.has("persistent_workers"):
        pytest.skip("loader does not declare capability 'persistent_workers'")
    if not persistent and check_env.settings.profile == "quick":
        pytest.skip("quick profile: persistent workers only (20 fresh iterators boot 40 workers)")
    if not persistent and check_env.context_name == "spawn":
        # 40 spawn boots were the slowest minute of the full profile (65 s of its 12 min); an fd
        # a spawn iterator leaks is already leaks.clean_exit's, whose spawn cases diff fds
        pytest.skip("fresh iterators run under forkserver and fork only (40 spawn boots cost a minute; "
                    "leaks.clean_exit diffs a spawn iterator's fds)")
    p = check_env.parallelism(N)
    loader = check_env.make(WorkerTagDataset(8), num_workers=N, parallelism=p, persistent_workers=persistent)
    driver: list[int] = []
    workers: dict[int, list[int | None]] = {}
    for _epoch in range(EPOCHS):
        pids = set()
        for batch in loader:
            pids.update(int(x) for x in batch["pid"])
        del batch  # a batch still referenced keeps its shm fd: not a leak
        gc.collect()
        driver.append(psutil.Process().num_fds())
        if persistent:
            for pid in sorted(pids):
                workers.setdefault(pid, []).append(_num_fds(pid))
    del loader
    series = {"driver": driver, **{f"worker pid {pid}": s for pid, s in workers.items()}}
    record_measurements(check_env.request.node, fds_per_epoch=series)
    grew = []
    for who, s in series.items():
        if len(s) == EPOCHS and None not in s and s[-1] - s[1] > FD_ALLOWANCE:
            grew.append(f"{who}: {s[1]} -> {s[-1]} fds (epochs 2 -> {EPOCHS}; series {s})")
    assert not grew, (f"fds grew by more than {FD_ALLOWANCE} over {EPOCHS} epochs "
                      f"({'persistent workers' if persistent else 'a fresh iterator per epoch'}): " + "; ".join(grew))


@check("leaks.shm_segments", "no /dev/shm entry the loader's processes created outlives it (exhaustion, "
       "early break, a worker error)")
@pytest.mark.parametrize("ending", ["exhaustion", "early_break", "worker_error"])
def test_shm_segments(check_env, ending):
    """no `/dev/shm` entry (torch's, multiprocessing's or the loader's own, any name) created by the driver or a
    worker outlives the loader by `--workerstart-exit-timeout` after exhaustion, an early `break`, or an error
    raised by the dataset in a worker; the entries seen are in the verdict JSON
    (`measurements.shm_entries_seen`), leftovers are unlinked by the suite. A driver SIGKILL is
    `failure.driver_killed`'s case. Under torch's default `file_descriptor` strategy torch's own segments are
    unlinked at creation; a loader's `SharedMemory` blocks are what this catches

    Observed by: the test process's tree sampled every 50 ms while the loader runs, and each worker started
    through the suite's context reporting what it maps as it exits: an entry created meanwhile that a member
    maps or holds open (`/proc/PID/maps`, `/proc/PID/fd`, by inode) is the loader's; entries that existed before
    are never counted. A segment created and closed between two samples by a process that does not report at
    exit is not seen

    Entries are attributed while the loader runs (:class:`ShmWatch`, plus what each
    worker maps as it exits): what a worker created and left is mapped by no one at
    the end, so an end snapshot misses it. A driver SIGKILL is ``failure.driver_killed``'s case.
    """
    if ending == "worker_error":
        def epoch(ctx) -> None:
            loader = check_env.make(CorruptItemDataset(16, bad=5), num_workers=N, ctx=ctx,
                                    parallelism=check_env.parallelism(N))
            held = check_env.run_expecting_failure(lambda: [None for _batch in loader])
            assert isinstance(held.exc, ValueError) and "item 5 is corrupt" in str(held.exc), (
                f"expected the dataset's ValueError, got {held.exc!r}")
            check_env.release_held(held, N, ctx)  # the shutdown it sets off, within the failure patience

        got = _watch_shm(check_env, epoch)
    else:
        got = _ordinary_ending(check_env, ending)
    record_measurements(check_env.request.node, shm_entries_seen=got["shm_seen"])
    left = got["shm_left"]
    if left:
        pytest.fail(f"{len(left)} /dev/shm entr{'y' if len(left) == 1 else 'ies'} created by the loader's processes "
                    f"outlived it by {check_env.settings.exit_timeout:.0f} s after {ending.replace('_', ' ')} "
                    f"(unlinked by the suite: {got['shm_unlinked']}): {', '.join(left)}", pytrace=False)
