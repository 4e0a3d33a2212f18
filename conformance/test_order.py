"""Order clause: registration order and per-worker seeds survive any start order.

Adversarial timing: the instrumented context delays ``start()`` of worker i by
(N-1-i) x 0.4 s, so under parallel start worker N-1 finishes first and worker 0
last. What each worker did is observed through ``get_worker_info()`` and
``torch.initial_seed()`` recorded in the samples themselves.
"""

import pytest
import torch

from pytest_workerstart.fixtures.datasets import WorkerTagDataset
from pytest_workerstart.checkenv import batches_of
from pytest_workerstart.probes.faults import FaultPlan

check = pytest.mark.workerstart_check
N = 3
SEEDS = pytest.StashKey[dict]()


def _parallelism(check_env, p):
    """p for loaders with parallel start here; None (use the default) otherwise."""
    return p if check_env.parallel_start_here else None


@check("order.registration")
def test_registration(check_env):
    ds = WorkerTagDataset(4 * N * 2)
    ctx = check_env.context(N, faults=FaultPlan.reverse_finish(N))
    loader = check_env.make(ds, num_workers=N, ctx=ctx, parallelism=_parallelism(check_env, N))
    batches = batches_of(loader)
    served = [b["worker"].tolist() for b in batches]
    wrong = [(k, s) for k, s in enumerate(served) if set(s) != {k % N}]
    assert not wrong, (
        f"batch k must come from worker k mod {N} (start order was {ctx.start_order()}); "
        f"mismatches (batch, workers): {wrong[:6]}")
    truth = [int(i) for b in batches_of(check_env.loader.factory(ds, batch_size=2, num_workers=0)) for i in b["index"]]
    assert [int(i) for b in batches for i in b["index"]] == truth, "output differs from the num_workers=0 truth"


def _seeds(check_env, p):
    ds = WorkerTagDataset(2 * N)
    ctx = check_env.context(N, faults=FaultPlan.reverse_finish(N))
    loader = check_env.make(ds, num_workers=N, ctx=ctx, parallelism=p, batch_size=1,
                     generator=torch.Generator().manual_seed(1234))
    seeds = {}
    for b in batches_of(loader):
        seeds.setdefault(int(b["worker"][0]), set()).add(int(b["seed"][0]))
    return {w: sorted(s) for w, s in sorted(seeds.items())}


@check("order.worker_seeds")
def test_worker_seeds(check_env):
    serial = _seeds(check_env, 1 if check_env.parallel_start_here else None)
    assert len(serial) == N and all(len(s) == 1 for s in serial.values()), f"one seed per worker expected: {serial}"
    flat = [s[0] for s in serial.values()]
    assert len(set(flat)) == N, f"workers share seeds: {serial}"
    if check_env.parallel_start_here:
        parallel = _seeds(check_env, N)
        assert parallel == serial, f"seeds differ between p=1 {serial} and p={N} {parallel}"
    seen = check_env.request.config.stash.setdefault(SEEDS, {})
    for other_ctx, other in seen.items():
        assert other == serial, f"seeds differ between contexts: {other_ctx} {other} vs {check_env.context_name} {serial}"
    seen[check_env.context_name] = serial
