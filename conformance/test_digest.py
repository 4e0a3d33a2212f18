"""Digest clause: the first batch is the same whatever the start parallelism,
in every context, and equals the in-process truth for deterministic datasets."""

import pytest
import torch
from torch.utils.data import default_collate

from pytest_workerstart.fixtures.datasets import AugmentedDataset, NestedMapDataset, ShardedRange
from pytest_workerstart.probes.digest import batch_digest, in_process_truth

check = pytest.mark.workerstart_check
N = 3
DIGESTS = pytest.StashKey[dict]()


def _first(check_env, dataset, p, **kw):
    loader = check_env.make(dataset, num_workers=N, parallelism=p, **kw)
    return next(iter(loader))


@check("digest.first_batch")
@pytest.mark.parametrize("kind", ["map_nested", "iterable", "augmented"])
def test_first_batch(check_env, kind):
    kw = {"batch_size": 4}
    if kind == "map_nested":
        ds, kw["shuffle"] = NestedMapDataset(32), True
        truth = batch_digest(in_process_truth(ds, check_env.loader.factory, shuffle=True, batch_size=4,
                                              generator=torch.Generator().manual_seed(7)))
    elif kind == "iterable":
        if not check_env.loader.has("iterable_dataset"):
            pytest.skip("loader does not declare capability 'iterable_dataset'")
        ds = ShardedRange(24)
        truth = batch_digest(default_collate(list(range(0, 24, N))[:4]))  # worker 0's shard
    else:
        ds, kw["shuffle"], truth = AugmentedDataset(32), True, None
    ps = [1, N] if check_env.parallel_start_here else [None]
    digests = {p: batch_digest(_first(check_env, ds, p, generator=torch.Generator().manual_seed(7), **kw)) for p in ps}
    assert len(set(digests.values())) == 1, f"first-batch digest depends on parallelism: {digests}"
    got = next(iter(digests.values()))
    if truth is not None:
        assert got == truth, f"first batch {got[:16]} != in-process truth {truth[:16]}"
    seen = check_env.request.config.stash.setdefault(DIGESTS, {})
    for other_ctx, other in seen.get(kind, {}).items():
        assert other == got, f"first batch differs between contexts: {other_ctx} {other[:16]} vs {check_env.context_name} {got[:16]}"
    seen.setdefault(kind, {})[check_env.context_name] = got
