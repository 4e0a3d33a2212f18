"""prefetch.bound: in-flight batches never exceed prefetch_factor x num_workers.

A dataset appends a line per fetched item to a file; the test consumes slowly
and, after each batch, counts fetched-but-unconsumed items from outside. Batch
size 1, so items are batches. The bound is a hard invariant: it does not
depend on the machine's speed, only a loader that prefetches more can fail.
"""

import time

import pytest

from pytest_workerstart import parity
from pytest_workerstart.datasets import CountingDataset

check = pytest.mark.workerstart_check
N = 2
PF = 2


@check("prefetch.bound", "in-flight batches never exceed prefetch_factor x num_workers")
def test_bound(check_env, tmp_path):
    """fetched-but-unconsumed items never exceed `prefetch_factor × num_workers`

    Observed by: a dataset that logs each fetch to a file; slow consumer
    """
    ds = CountingDataset(str(tmp_path / "fetched.txt"), n=40)
    loader = check_env.make(ds, num_workers=N, parallelism=check_env.parallelism(N), batch_size=1,
                     prefetch_factor=PF)
    worst = 0
    for consumed, _batch in enumerate(loader, start=1):
        time.sleep(0.05)  # a slow consumer: an unbounded loader runs far ahead
        ahead = ds.fetched() - consumed
        worst = max(worst, ahead)
        if consumed == 20:
            break
    del loader
    assert worst <= PF * N, f"{worst} batches were in flight beyond those consumed (bound {PF} x {N} = {PF * N})"


@check("prefetch.bound")
def test_bound_at(check_env, ws_point):
    """Fetched but unconsumed samples stay within prefetch_factor x num_workers batches at every
    point of the data path (counted from the side channel's records, never above the truth)."""
    parity.judge_case(check_env, ws_point)
