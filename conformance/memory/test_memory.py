"""memory.epoch_growth: a persistent worker does not grow from epoch to epoch.

On a dataset whose items are views of one tensor allocated at construction
(fetching allocates nothing that outlives the batch), each worker's growth from
the end of epoch 2 (epoch 1 warms allocators and caches) to the end of epoch 10
must stay within ``max(2 MiB, 1 %)``. Growth is the smaller of the USS and the
RSS increase: memory the worker allocated and kept raises both, while USS alone
also jumps when a page the worker shared with its forkserver or parent becomes
private because *that* process wrote to it (seen for torch and the reference:
+2.3 MiB in both forkserver workers at once, RSS flat). Both series are in the verdict. Worker pids come
from the suite's instrumented context, not from the loader (pytorch #62066).
"""

import gc

import psutil
import pytest

from pytest_workerstart.datasets import PreallocatedDataset
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 2
EPOCHS = 10
MIB = 2**20
ALLOWANCE_MIB, ALLOWANCE_FRACTION = 2.0, 0.01


def _uss_rss_mib(pid: int) -> tuple[float, float] | None:
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return None
    return round(info.uss / MIB, 2), round(info.rss / MIB, 2)


@check("memory.epoch_growth", "a persistent worker's USS stays flat from epoch 2 to epoch 10",
       requires=("persistent_workers",))
def test_epoch_growth(check_env):
    """with persistent workers, over ${EPOCHS} epochs of a dataset whose items are views of one tensor allocated at
    construction (`PreallocatedDataset`: fetching allocates nothing that outlives the batch), no worker grows by
    more than `max(2 MiB, 1 % of its RSS)` from the end of epoch 2 to the end of epoch ${EPOCHS}; growth is the smaller
    of the USS and the RSS increase, because USS alone also jumps when a page shared with the forkserver becomes
    private through the *forkserver's* write (seen for torch and the reference alike: +2.3 MiB in both workers
    at once, RSS flat); memory the worker allocates and keeps raises both. Both per-epoch series are in the
    verdict JSON (`measurements`)

    Observed by: `psutil` `memory_full_info()` of the worker pids recorded by the suite's instrumented context,
    after each epoch (pytorch #62066)
    """
    ctx = check_env.context(N)
    p = check_env.parallelism(N)
    loader = check_env.make(PreallocatedDataset(32), ctx=ctx, num_workers=N, parallelism=p, persistent_workers=True)
    series: dict[str, list[tuple[float, float] | None]] = {}
    for _epoch in range(EPOCHS):
        for batch in loader:
            pass
        del batch
        gc.collect()
        for rec in ctx.records():
            if rec.pid is not None:
                series.setdefault(f"worker {rec.worker} (pid {rec.pid})", []).append(_uss_rss_mib(rec.pid))
    del loader
    record_measurements(check_env.request.node,
                        uss_mib_per_epoch={w: [m and m[0] for m in s] for w, s in series.items()},
                        rss_mib_per_epoch={w: [m and m[1] for m in s] for w, s in series.items()})
    assert series, "the suite's context recorded no worker"
    grew = []
    for who, s in series.items():
        if len(s) != EPOCHS or None in s:
            grew.append(f"{who}: not alive through all {EPOCHS} epochs (series {s}); persistent workers must be")
            continue
        (uss2, rss2), (uss_end, rss_end) = s[1], s[-1]
        bound = max(ALLOWANCE_MIB, ALLOWANCE_FRACTION * rss2)
        if min(uss_end - uss2, rss_end - rss2) > bound:
            grew.append(f"{who}: USS {uss2} -> {uss_end} MiB, RSS {rss2} -> {rss_end} MiB (epochs 2 -> {EPOCHS}, "
                        f"bound +{bound:.1f} MiB; USS series {[m[0] for m in s]})")
    assert not grew, "a persistent worker grew from epoch to epoch: " + "; ".join(grew)
