"""sharding.exactly_once: an IterableDataset that shards by get_worker_info()
yields each sample exactly once per epoch across workers.

If duplicates appear, the report gives the duplication factor (a dataset, or a
loader, that does not shard duplicates every sample num_workers times). The
distributed part (DistributedSampler over 2 gloo ranks) is not here yet.
"""

import collections

import pytest

from pytest_workerstart.fixtures.datasets import ShardedRange

check = pytest.mark.workerstart_check
N = 3


@check("sharding.exactly_once", requires=("iterable_dataset",))
def test_exactly_once(ws):
    n = 30
    loader = ws.make(ShardedRange(n), num_workers=N, parallelism=N if ws.max_parallel else None, batch_size=None)
    counts = collections.Counter(int(x) for x in loader)
    missing = sorted(set(range(n)) - set(counts))
    dup = {k: c for k, c in counts.items() if c > 1}
    factor = sum(counts.values()) / n
    assert not dup and not missing, (
        f"each of {n} samples must appear once per epoch: duplication factor {factor:.2f} "
        f"({len(dup)} duplicated, {len(missing)} missing; num_workers={N})")
