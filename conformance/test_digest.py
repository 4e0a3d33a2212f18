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


def _first(ws, dataset, p, **kw):
    loader = ws.make(dataset, num_workers=N, parallelism=p, **kw)
    return next(iter(loader))


@check("digest.first_batch")
@pytest.mark.parametrize("kind", ["map_nested", "iterable", "augmented"])
def test_first_batch(ws, kind):
    kw = {"batch_size": 4}
    if kind == "map_nested":
        ds, kw["shuffle"] = NestedMapDataset(32), True
        truth = batch_digest(in_process_truth(ds, ws.loader.factory, shuffle=True, batch_size=4,
                                              generator=torch.Generator().manual_seed(7)))
    elif kind == "iterable":
        if not ws.loader.has("iterable_dataset"):
            pytest.skip("loader does not declare capability 'iterable_dataset'")
        ds = ShardedRange(24)
        truth = batch_digest(default_collate(list(range(0, 24, N))[:4]))  # worker 0's shard
    else:
        ds, kw["shuffle"], truth = AugmentedDataset(32), True, None
    ps = [1, N] if ws.max_parallel else [None]
    digests = {p: batch_digest(_first(ws, ds, p, generator=torch.Generator().manual_seed(7), **kw)) for p in ps}
    assert len(set(digests.values())) == 1, f"first-batch digest depends on parallelism: {digests}"
    got = next(iter(digests.values()))
    if truth is not None:
        assert got == truth, f"first batch {got[:16]} != in-process truth {truth[:16]}"
    seen = ws.request.config.stash.setdefault(DIGESTS, {})
    for other_ctx, other in seen.get(kind, {}).items():
        assert other == got, f"first batch differs between contexts: {other_ctx} {other[:16]} vs {ws.context_name} {got[:16]}"
    seen.setdefault(kind, {})[ws.context_name] = got
