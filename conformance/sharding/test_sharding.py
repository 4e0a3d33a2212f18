"""sharding.exactly_once: an IterableDataset that shards by get_worker_info()
yields each sample exactly once per epoch across workers.

If duplicates appear, the report gives the duplication factor (a dataset, or a
loader, that does not shard duplicates every sample num_workers times). Over
ranks (DistributedSampler and rank x worker sharding in a 2-rank gloo group), in
one context: see ``_ranks_context``.
"""

import collections

import pytest

from pytest_workerstart import parity, protocol, scenarios
from pytest_workerstart.conformance.sharding import ranks as distributed
from pytest_workerstart.datasets import ShardedRange
from pytest_workerstart.harness.lookahead import planned_scenario
from pytest_workerstart.space import Point

check = pytest.mark.workerstart_check
N = 3


def expected_batches(point: Point) -> list[tuple[int, ...]]:
    """torch's batches of one epoch of ``ShardedRange(point.length)`` at ``point``, computed here:
    worker w yields w, w + N, ...; each worker batches its own stream and, with drop_last,
    drops its own short last batch. Sorted: the clause judges what is served, not its order."""
    n, b = point.num_workers, point.batch_size
    out = []
    for w in range(n):
        stream = list(range(w, point.length, n))
        if b is None:
            out += [(x,) for x in stream]
            continue
        chunks = [tuple(stream[i:i + b]) for i in range(0, len(stream), b)]
        if point.drop_last and chunks and len(chunks[-1]) < b:
            chunks.pop()
        out += chunks
    return sorted(out)


def _served(batch) -> tuple[int, ...]:
    """A batch's samples (batch_size=None: one sample, an int or a 0-d tensor)."""
    if hasattr(batch, "reshape"):
        return tuple(int(x) for x in batch.reshape(-1).tolist())
    return (int(batch),) if isinstance(batch, int) else tuple(int(x) for x in batch)


@check("sharding.exactly_once", "each sample exactly once per epoch, across workers and ranks",
       requires=("iterable_dataset",), corners={
           "even": {"at": "N=3,p=none,data=iterable,len=30,batch=none", "collected": False,
                    "why": "even shards, unbatched: the clause's first case"},
           "uneven": {"at": "N=3,p=3,data=iterable,len=31,batch=2,persistent=1,epochs=2", "profiles": ("full",),
                      "why": "uneven shards, two epochs of persistent workers"}})
def test_exactly_once(check_env):
    """an IterableDataset sharding by `get_worker_info()` yields each sample once per epoch; otherwise the
    duplication factor is reported. Over ranks (in one context: forkserver if selected, preferring a context
    where the loader declares parallel start; the others skip with that reason, since which rank × worker gets
    which index does not depend on how workers start, and the in-process case covers every context): ${WORLD}
    ranks of a real `torch.distributed` gloo group on 127.0.0.1, each starting its workers in parallel: a
    `DistributedSampler` map dataset and a rank × worker sharded iterable cover every index exactly once; a rank
    whose worker fails to start raises and cleans up, the other rank's wait is bounded by the group timeout
    (${PG_TIMEOUT} s), and no process is left once the ranks exit. Beyond the first case (N = ${N}, 30 samples,
    unbatched), the corner `uneven` (full profile: 31 samples, batch 2, persistent workers, 2 epochs) and
    explored points ([Configuration space](#configuration-space)): every epoch serves exactly torch's batches,
    computed in the test process (worker w yields w, w + N, ...; each worker batches its own stream and, with
    `drop_last`, drops its own short last batch)

    Observed by: counting samples; per-rank reports from a scenario process; batches compared as multisets per
    epoch
    """
    n = 30
    loader = check_env.make(ShardedRange(n), num_workers=N, parallelism=check_env.parallelism(N),
                            batch_size=None)
    counts = collections.Counter(int(x) for x in loader)
    missing = sorted(set(range(n)) - set(counts))
    dup = {k: c for k, c in counts.items() if c > 1}
    factor = sum(counts.values()) / n
    assert not dup and not missing, (
        f"each of {n} samples must appear once per epoch: duplication factor {factor:.2f} "
        f"({len(dup)} duplicated, {len(missing)} missing; num_workers={N})")


@check("sharding.exactly_once")
def test_exactly_once_at(check_env, ws_point):
    """The space's corners beyond the first case, and explored points over every argument of the
    data path, map-style and iterable: torch's DataLoader serves every sample once, and so must the loader."""
    parity.judge_case(check_env, ws_point)


WORLD = 2
PG_TIMEOUT = 20.0


N_RANKED = 24


def _fail_rank(ranks: str) -> int | None:
    return 1 if ranks == "distributed_failing_rank" else None


def _ranks_context(env) -> str:
    """Where the over-ranks cases run: one context, forkserver first, preferring one with parallel start.

    What they judge (which rank x worker gets which index, a failing rank's group) does not
    depend on how workers start, which the in-process case and the failure clause cover in every
    context; each run costs two ranks that import torch and boot their own workers."""
    selected = env.settings.context or protocol.available_contexts()
    ordered = sorted(selected, key=lambda c: (not env.loader.has("parallel_start", c), c != "forkserver"))
    return ordered[0]


def _plan(env, ranks):
    if env.settings.profile == "quick" and ranks != "distributed":
        pytest.skip("quick profile: the covering case only")
    where = _ranks_context(env)
    if env.context_name != where:
        pytest.skip(f"the over-ranks cases run in one context, {where} (rank x worker assignment "
                    "does not depend on how workers start; the in-process case covers every context)")
    return scenarios.planned(env, distributed.scenario_distributed, timeout=4 * PG_TIMEOUT + 120,
                             world_size=WORLD, num_workers=2, parallelism=env.parallelism(2), n=N_RANKED,
                             fail_rank=_fail_rank(ranks), pg_timeout=PG_TIMEOUT)


@check("sharding.exactly_once")
@planned_scenario(_plan)
@pytest.mark.parametrize("ranks", ["distributed", "distributed_failing_rank"])
def test_exactly_once_over_ranks(check_env, ranks):
    out = scenarios.value_of(check_env.scenario_result())
    distributed.judge_distributed(out, WORLD, 2, N_RANKED, _fail_rank(ranks), PG_TIMEOUT)
