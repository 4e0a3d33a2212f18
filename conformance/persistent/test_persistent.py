"""persistent.reuse: with persistent_workers=True the pool lives as long as the
loader, not the iterator: epochs 2 and 3 use epoch 1's worker pids and start
nothing new (the instrumented context counts every Process built)."""

import pytest

from pytest_workerstart import parity
from pytest_workerstart.datasets import WorkerTagDataset

check = pytest.mark.workerstart_check
N = 2


@check("persistent.reuse", "persistent workers live as long as the loader", requires=("persistent_workers",))
def test_reuse(check_env):
    """with `persistent_workers=True` epochs 2 and 3 use epoch 1's pids and build nothing

    Observed by: pids in samples; Processes built
    """
    ctx = check_env.context(N)
    loader = check_env.make(WorkerTagDataset(8), num_workers=N, ctx=ctx, parallelism=check_env.parallelism(N),
                     persistent_workers=True)
    pids = []
    for _epoch in range(3):
        pids.append(sorted({int(p) for batch in loader for p in batch["pid"]}))
    built = len(ctx.records())
    del loader
    assert pids[0] == pids[1] == pids[2], f"worker pids changed across epochs: {pids}"
    assert built == N, f"{built} worker processes were built over 3 epochs (want {N})"


@check("persistent.reuse")
def test_reuse_at(check_env, ws_point):
    """With persistent_workers, no worker process beyond torch's serves a loader's epochs, at every
    point of the data path."""
    parity.judge_case(check_env, ws_point)
