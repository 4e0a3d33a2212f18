"""Digest clause.

``digest.first_batch``: the first batch is the same whatever the start
parallelism and context, its order equals the loader's own ``num_workers=0``
order (a consistently different sampler is judged by ``digest.torch_parity``,
not here), and its *content* equals what the test process computes from the
dataset for the indices the batch carries (default collate), so a loader that
alters samples cannot pass by being consistent with itself.

``digest.torch_parity``: the first K batches equal torch's own ``DataLoader``
for the same arguments and an identically seeded generator, at
``num_workers=0`` and N: map-style shuffled (torch's batches computed in this
process), and an IterableDataset sharded by worker (torch delivers batch k
from worker k mod N's shard, computed here). A loader may declare
``torch_parity=false``.
"""

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from pytest_workerstart.fixtures.datasets import AugmentedDataset, NestedMapDataset, ShardedRange
from pytest_workerstart.probes.digest import batch_digest, in_process_truth

check = pytest.mark.workerstart_check
N = 3
K = 3  # batches compared with torch's
DIGESTS = pytest.StashKey[dict]()


def _first(check_env, dataset, p, **kw):
    loader = check_env.make(dataset, num_workers=N, parallelism=p, **kw)
    return next(iter(loader))


def _expected_content(dataset, batch) -> str:
    """The digest of the batch the test process builds from the indices ``batch`` carries."""
    return batch_digest(default_collate([dataset[int(i)] for i in batch["index"]]))


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
    batches = {p: _first(check_env, ds, p, generator=torch.Generator().manual_seed(7), **kw) for p in ps}
    digests = {p: batch_digest(b) for p, b in batches.items()}
    assert len(set(digests.values())) == 1, f"first-batch digest depends on parallelism: {digests}"
    got = next(iter(digests.values()))
    if kind == "map_nested":
        expected = _expected_content(ds, next(iter(batches.values())))
        assert got == expected, (
            f"the samples delivered differ from the dataset's items for the indices they carry "
            f"(digest {got[:16]} != {expected[:16]} computed in the test process): the loader alters samples")
    if truth is not None:
        assert got == truth, f"first batch {got[:16]} != in-process truth {truth[:16]}"
    # per loader: a project's own tests may judge several loaders in one session
    seen = check_env.request.config.stash.setdefault(DIGESTS, {}).setdefault(check_env.loader.spec, {})
    for other_ctx, other in seen.get(kind, {}).items():
        assert other == got, (f"first batch differs between contexts: {other_ctx} {other[:16]} "
                              f"vs {check_env.context_name} {got[:16]}")
    seen.setdefault(kind, {})[check_env.context_name] = got


def _torch_batches(kind: str, workers: int) -> list[str]:
    """Torch's own first K batches (digests) with ``workers`` workers, computed in this process."""
    if kind == "map_shuffled":
        dl = DataLoader(NestedMapDataset(32), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
        it = iter(dl)
        return [batch_digest(next(it)) for _ in range(K)]
    # torch, in order: batch k comes from worker k mod W, the (k // W)-th batch of that worker's shard
    w_count = max(1, workers)
    shards = [list(range(w, 24, w_count)) for w in range(w_count)]
    return [batch_digest(default_collate(shards[k % w_count][4 * (k // w_count):4 * (k // w_count) + 4]))
            for k in range(K)]


@check("digest.torch_parity")
@pytest.mark.parametrize("kind", ["map_shuffled", "iterable_sharded"])
def test_torch_parity(check_env, kind):
    if kind == "iterable_sharded" and not check_env.loader.has("iterable_dataset"):
        pytest.skip("loader does not declare capability 'iterable_dataset'")
    runs = [(0, None)] + [(N, p) for p in ([N] if check_env.parallel_start_here else [None])]
    for workers, p in runs:
        ds = NestedMapDataset(32) if kind == "map_shuffled" else ShardedRange(24)
        kw = {"shuffle": True, "generator": torch.Generator().manual_seed(7)} if kind == "map_shuffled" else {}
        loader = check_env.make(ds, num_workers=workers, parallelism=p, batch_size=4, **kw)
        it = iter(loader)
        got = [batch_digest(next(it)) for _ in range(K)]
        truth = _torch_batches(kind, workers)
        del it, loader
        wrong = [k for k in range(K) if got[k] != truth[k]]
        assert not wrong, (
            f"num_workers={workers}{f', p={p}' if p else ''}: batches {wrong} differ from torch's DataLoader for the "
            f"same arguments and generator (got {[d[:12] for d in got]}, torch {[d[:12] for d in truth]}); "
            f"declare torch_parity=false if the loader deliberately differs")
