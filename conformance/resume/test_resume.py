"""resume.state_dict: stop after k batches, resume in a new loader, get exactly the rest.

For loaders with ``state_dict()``/``load_state_dict()`` (detected, or declared
with the ``state_dict`` capability). The state crosses a pickle round trip, as a
checkpoint would. ``sequential``: the truth is computed here (indices in order,
batches of 2); ``shuffled`` (seeded generator): the truth is the epoch of the loader
whose state was saved, carried on to its end after ``state_dict()``, as training goes on
after a checkpoint, since the order is the loader's to choose.
Run with p = 1 and, where the loader declares parallel start, p = N (torchdata
PR #1553 tests its parallel start this way).
"""

import pickle

import pytest
import torch

from pytest_workerstart.datasets import WorkerTagDataset

check = pytest.mark.workerstart_check
N = 2
ITEMS, BATCH, STOP_AFTER = 24, 2, 5


def _indices(batches) -> list[list[int]]:
    return [[int(i) for i in b["index"]] for b in batches]


@check("resume.state_dict", "stopping after k batches and resuming in a new loader gives exactly the rest",
       requires=("state_dict",), contexts=("spawn", "forkserver"))
@pytest.mark.parametrize("order", ["sequential", "shuffled"])
@pytest.mark.parametrize("p", ["p1", "pN"])
def test_resume(check_env, order, p):
    """for a loader with `state_dict()`/`load_state_dict()` (capability `state_dict`, detected when the class has
    both methods, or declared): stopping after 5 of 12 batches, passing the state through a pickle round trip
    and loading it into a new loader built with the same arguments yields exactly the remaining 7 batches.
    Cases: `sequential` (the truth, indices in order in batches of 2, is computed by the test) and `shuffled`
    with a seeded generator (the truth is the saved loader's own epoch, carried on to its end after
    `state_dict()` as training goes on after a checkpoint: the order is the loader's to choose), each with p = 1
    and, where parallel start is declared, p = N; spawn and forkserver. Quick profile: sequential, p = N (p = 1
    without parallel start)

    Observed by: the `index` of every sample in the delivered batches
    """
    covering = ("sequential", "pN" if check_env.parallel_start_here else "p1")
    if check_env.settings.profile == "quick" and (order, p) != covering:
        pytest.skip(f"quick profile: the covering case only ({covering[0]}, {covering[1]})")
    parallelism = None
    if p == "pN":
        if not check_env.parallel_start_here:
            pytest.skip(f"p = N needs parallel start: {check_env.loader.spec} declares none in "
                        f"{check_env.context_name}")
        parallelism = N
    elif check_env.parallel_start_here:
        parallelism = 1

    def make():
        kw = {"shuffle": True, "generator": torch.Generator().manual_seed(7)} if order == "shuffled" else {}
        return check_env.make(WorkerTagDataset(ITEMS), num_workers=N, parallelism=parallelism, batch_size=BATCH, **kw)

    first = make()
    it = iter(first)
    head = [next(it) for _ in range(STOP_AFTER)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    if order == "sequential":
        truth = [list(range(k, min(k + BATCH, ITEMS))) for k in range(0, ITEMS, BATCH)]
        del it
    else:
        truth = _indices(head) + _indices(it)
        assert sorted(i for b in truth for i in b) == list(range(ITEMS)), (
            f"the epoch carried on after state_dict() is not a permutation: {truth}")
    del first
    second = make()
    second.load_state_dict(state)
    rest = _indices(second)
    del second
    assert _indices(head) == truth[:STOP_AFTER], (
        f"the first {STOP_AFTER} batches differ: {_indices(head)} vs {truth[:STOP_AFTER]}")
    assert rest == truth[STOP_AFTER:], (
        f"resumed after {STOP_AFTER} of {len(truth)} batches ({order}, p={parallelism or 'none'}): "
        f"got {len(rest)} batches "
        f"{rest[:4]}{'...' if len(rest) > 4 else ''}, expected the remaining {len(truth) - STOP_AFTER} "
        f"{truth[STOP_AFTER:STOP_AFTER + 4]}{'...' if len(truth) - STOP_AFTER > 4 else ''}")
