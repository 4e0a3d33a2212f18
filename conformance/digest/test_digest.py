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

from pytest_workerstart import parity
from pytest_workerstart.datasets import AugmentedDataset, NestedMapDataset, ShardedRange
from pytest_workerstart.probes.digest import batch_digest, in_process_truth

check = pytest.mark.workerstart_check
N = 3
K = 3  # batches compared with torch's
DIGESTS = pytest.StashKey[dict]()


DATASETS = {"map": lambda: NestedMapDataset(32), "iterable": lambda: ShardedRange(24),
            "augmented": lambda: AugmentedDataset(32)}


def _first_batches(check_env, kind: str, workers: int, p: int | None) -> dict:
    """The digests of the first K batches (batch 4, generator seeded 7, shuffled unless iterable)
    and the indices the first one carries: judged by both ids."""
    def run() -> dict:
        kw = {} if kind == "iterable" else {"shuffle": True}
        loader = check_env.make(DATASETS[kind](), num_workers=workers, parallelism=p, batch_size=4,
                                generator=torch.Generator().manual_seed(7), **kw)
        it = iter(loader)
        batches = [next(it) for _ in range(K)]
        del it, loader
        first = batches[0]
        return {"digests": [batch_digest(b) for b in batches],
                "first_index": [int(i) for i in first["index"]] if isinstance(first, dict) else None}

    return check_env.observe("the first batches", run, kind, workers, p)


def _expected_content(dataset, indices: list[int]) -> str:
    """The digest of the batch the test process builds from the dataset's items at ``indices``."""
    return batch_digest(default_collate([dataset[i] for i in indices]))


@check("digest.first_batch", "the first batch is the same for every parallelism and context, with the "
       "dataset's content")
@pytest.mark.parametrize("kind", ["map_nested", "iterable", "augmented"])
def test_first_batch(check_env, kind):
    """the first batch's SHA-256 is identical for p=1 and p=N and across contexts, its order equals the loader's
    own `num_workers=0` order, and its content equals what the test process computes from the dataset for the
    indices the batch carries (default collate) (nested map dataset, sharded iterable dataset; the per-worker
    random augmentation is compared across p)

    Observed by: canonical batch digest; the runs at N workers are the ones `digest.torch_parity` judges
    """
    if kind == "map_nested":
        truth = batch_digest(in_process_truth(NestedMapDataset(32), check_env.loader.factory, shuffle=True,
                                              batch_size=4, generator=torch.Generator().manual_seed(7)))
    elif kind == "iterable":
        if not check_env.loader.has("iterable_dataset"):
            pytest.skip("loader does not declare capability 'iterable_dataset'")
        truth = batch_digest(default_collate(list(range(0, 24, N))[:4]))  # worker 0's shard
    else:
        truth = None
    ps = [1, N] if check_env.parallel_start_here else [None]
    runs = {p: _first_batches(check_env, kind.removesuffix("_nested"), N, p) for p in ps}
    digests = {p: run["digests"][0] for p, run in runs.items()}
    assert len(set(digests.values())) == 1, f"first-batch digest depends on parallelism: {digests}"
    got = next(iter(digests.values()))
    if kind == "map_nested":
        expected = _expected_content(NestedMapDataset(32), next(iter(runs.values()))["first_index"])
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


@check("digest.torch_parity", "the first batches equal torch's DataLoader's for the same arguments",
       requires=("torch_parity",))
@pytest.mark.parametrize("kind", ["map_shuffled", "iterable_sharded"])
def test_torch_parity(check_env, kind):
    """the first 3 batches equal torch's own `DataLoader`'s for the same arguments and an identically seeded
    generator, at `num_workers=0` and N (p=N where declared): map-style shuffled (torch's batches computed in
    the test process) and an IterableDataset sharded by worker (batch k from worker k mod N's shard); skipped
    for a loader that declares `torch_parity=false`

    Observed by: canonical batch digests
    """
    if kind == "iterable_sharded" and not check_env.loader.has("iterable_dataset"):
        pytest.skip("loader does not declare capability 'iterable_dataset'")
    runs = [(0, None)] + [(N, p) for p in ([N] if check_env.parallel_start_here else [None])]
    for workers, p in runs:
        got = _first_batches(check_env, "map" if kind == "map_shuffled" else "iterable", workers, p)["digests"]
        truth = _torch_batches(kind, workers)
        wrong = [k for k in range(K) if got[k] != truth[k]]
        assert not wrong, (
            f"num_workers={workers}{f', p={p}' if p else ''}: batches {wrong} differ from torch's DataLoader for the "
            f"same arguments and generator (got {[d[:12] for d in got]}, torch {[d[:12] for d in truth]}); "
            f"declare torch_parity=false if the loader deliberately differs")


@check("digest.first_batch")
def test_first_batch_at(check_env, ws_point):
    """Every batch is the dataset's samples collated as torch's DataLoader collates them, at every
    point of the data path: each sample structure default_collate handles, a collate_fn, __getitems__."""
    parity.judge_case(check_env, ws_point)


@check("digest.torch_parity")
def test_torch_parity_at(check_env, ws_point):
    """An argument torch's DataLoader refuses is refused alike (the same exception type, at the
    same step), and one it takes is taken."""
    parity.judge_case(check_env, ws_point)
