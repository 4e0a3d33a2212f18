"""sharding.exactly_once: an IterableDataset that shards by get_worker_info()
yields each sample exactly once per epoch across workers.

If duplicates appear, the report gives the duplication factor (a dataset, or a
loader, that does not shard duplicates every sample num_workers times). The
distributed part (DistributedSampler over 2 gloo ranks) is not here yet.
"""

import collections

import pytest

from pytest_workerstart import distributed, scenarios
from pytest_workerstart.fixtures.datasets import ShardedRange

check = pytest.mark.workerstart_check
N = 3


@check("sharding.exactly_once")
def test_exactly_once(check_env):
    n = 30
    loader = check_env.make(ShardedRange(n), num_workers=N, parallelism=N if check_env.parallel_start_here else None, batch_size=None)
    counts = collections.Counter(int(x) for x in loader)
    missing = sorted(set(range(n)) - set(counts))
    dup = {k: c for k, c in counts.items() if c > 1}
    factor = sum(counts.values()) / n
    assert not dup and not missing, (
        f"each of {n} samples must appear once per epoch: duplication factor {factor:.2f} "
        f"({len(dup)} duplicated, {len(missing)} missing; num_workers={N})")


WORLD = 2
PG_TIMEOUT = 20.0


@check("sharding.exactly_once")
@pytest.mark.parametrize("ranks", ["distributed", "distributed_failing_rank"])
def test_exactly_once_over_ranks(check_env, ranks, tmp_path):
    if check_env.settings.profile == "quick" and ranks != "distributed":
        pytest.skip("quick profile: the covering case only")
    fail_rank = 1 if ranks == "distributed_failing_rank" else None
    n = 24
    res = scenarios.run(check_env.loader, check_env.context_name, "pytest_workerstart.distributed:scenario_distributed",
                        timeout=4 * PG_TIMEOUT + 120, memory_limit=check_env.memory_limit,
                        world_size=WORLD, num_workers=2, parallelism=2 if check_env.parallel_start_here else None, n=n,
                        fail_rank=fail_rank, pg_timeout=PG_TIMEOUT, outdir=str(tmp_path))
    if res.status != "ok":
        pytest.fail(res.details(), pytrace=False)
    distributed.judge_distributed(res.value, WORLD, 2, n, fail_rank, PG_TIMEOUT)
