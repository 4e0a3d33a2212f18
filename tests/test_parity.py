"""The differential judge without a suite run: what a batch shows, each kind of difference
attributed to its clause with what differed, and torch's own DataLoader, judged against itself
over drawn points, differing nowhere (the judge's truth is torch: a difference there is the
suite's bug)."""

import collections
import dataclasses
import multiprocessing
import os
import random
import tempfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from pytest_workerstart import parity, space
from pytest_workerstart.parity_data import Pair, dataset_of, loader_kwargs, make_sample
from pytest_workerstart.point import Point

DEFAULT = Point(2, None, "map", 4, 2)


def _obs(epochs, records=None, **kw):
    return parity.Observation(epochs=epochs, records=records or [[] for _ in epochs], **kw)


def _rec(i, worker, seed=100, pid=1, draws=(1, 2, 3)):
    return (i, worker, seed + worker, pid + worker, *draws)


def test_a_batch_shows_every_container_and_leaf_type():
    batch = {"i": torch.tensor([1, 2]), "p": Pair(np.int64(3), [b"x", "y"]), "a": np.arange(2, dtype=np.int32)}
    f = parity.form(batch)
    assert parity.form(batch) == f and hash(f)
    assert parity.form({**batch, "p": (np.int64(3), [b"x", "y"])}) != f  # a namedtuple is not a tuple
    assert parity.form({**batch, "i": torch.tensor([1.0, 2.0])}) != f  # nor float an int
    assert parity.show(f) == "{'i': tensor([1, 2], int64), 'p': Pair(int64(3), [b'x', 'y']), 'a': ndarray([0, 1], <i4)}"
    assert len(parity.show(parity.form(list(range(100))), 40)) == 40


def test_each_sample_kind_is_a_pure_function_of_its_index():
    for kind in space.SAMPLES:
        assert parity.form(make_sample(kind, 3)) == parity.form(make_sample(kind, 3)) != parity.form(
            make_sample(kind, 4)), kind


def test_the_same_run_has_no_difference():
    obs = _obs([[("int", 0), ("int", 1)]], [[_rec(0, 0), _rec(1, 1)]])
    assert parity.compare(DEFAULT, obs, obs) == []


@pytest.mark.parametrize("got, records, clause, said", [
    ([("int", 0)], [_rec(0, 0)], "sharding.exactly_once", "fetched 0 samples torch's DataLoader does not [] and "
                                                           "not 1 it does [1]"),
    ([("int", 0), ("int", 0)], None, "sharding.exactly_once", "2 batches, torch's DataLoader serves 2: 1 of its "
                                                              "batches missing, 1 served again; batch 1: expected 1"),
    ([("int", 0), ("str", "1")], None, "digest.first_batch", "batch 1: got '1', which torch's DataLoader does not "
                                                             "serve in this epoch; its batch 1 is 1"),
    ([("int", 1), ("int", 0)], None, "order.epoch_shuffle", "batch 0: expected 0, got 1 (the same batches in "
                                                            "another order)"),
    ([("int", 1), ("int", 0)], [_rec(0, 1), _rec(1, 0)], "order.registration",
     "sample 0 was fetched by worker 1, in torch's DataLoader by worker 0"),
    (None, [_rec(0, 0, seed=7), _rec(1, 1)], "order.worker_seeds", "worker 0 has seed 7; torch's DataLoader gives "
                                                                    "it 100"),
    (None, [_rec(0, 0), _rec(1, 1, draws=(1, 2, 4))], "order.rng_streams",
     "sample 1 (worker 1): user code drew torch 1, random 2, numpy 4; in torch's DataLoader torch 1, random 2, "
     "numpy 3"),
])
def test_each_difference_is_reported_under_its_clause_saying_what_differed(got, records, clause, said):
    truth = _obs([[("int", 0), ("int", 1)]], [[_rec(0, 0), _rec(1, 1)]])
    other = _obs([got or truth.epochs[0]], [records or truth.records[0]])
    (diff,) = parity.compare(DEFAULT, truth, other)
    assert diff.clause == clause and said in diff.text and diff.text.startswith("epoch 1"), diff


def test_a_shuffled_order_is_told_from_a_worker_relabelling():
    """Unbatched and shuffled, another permutation also moves samples between workers: it is the
    order's fault; the same per-worker fetches under other worker ids are registration's."""
    point = dataclasses.replace(DEFAULT, batch_size=None, shuffle=True, length=4)
    truth = _obs([[("int", 2), ("int", 0), ("int", 3), ("int", 1)]],
                 [[_rec(2, 0), _rec(0, 1), _rec(3, 0), _rec(1, 1)]])
    permuted = _obs([[("int", 0), ("int", 1), ("int", 2), ("int", 3)]],
                    [[_rec(0, 0), _rec(1, 1), _rec(2, 0), _rec(3, 1)]])
    relabelled = _obs([[("int", 0), ("int", 2), ("int", 1), ("int", 3)]],
                      [[_rec(2, 1, pid=0), _rec(0, 0, pid=2), _rec(3, 1, pid=0), _rec(1, 0, pid=2)]])
    assert [d.clause for d in parity.compare(point, truth, permuted)][:1] == ["order.epoch_shuffle"]
    assert [d.clause for d in parity.compare(point, truth, relabelled)][:1] == ["order.registration"]


def test_errors_persistence_prefetch_and_transfer_are_attributed():
    point = Point(2, None, "map", 4, 2, prefetch_factor=1, persistent_workers=True, epochs=2)
    both = [_rec(0, 0), _rec(1, 1)]
    truth = _obs([[], []], [both, both], tensors=[[("batch", True, "other")]])
    got = _obs([[], []], [both, [_rec(0, 0, pid=9), _rec(1, 1, pid=9)]], inflight=5,
               tensors=[[("batch", False, "other")]])
    clauses = {d.clause: d.text for d in parity.compare(point, truth, got)}
    assert set(clauses) == {"persistent.reuse", "prefetch.bound", "transfer.shared_memory"}
    assert "4 worker processes served the 2 epochs" in clauses["persistent.reuse"]
    assert "5 samples were fetched beyond those consumed; at most prefetch_factor 1 x 2 workers x 2 per batch = 4" \
        in clauses["prefetch.bound"]
    assert "batch was copied (not in shared memory)" in clauses["transfer.shared_memory"]
    raised = _obs([], error=("epoch 1: batch 0", "TypeError", "no"))
    assert [d.clause for d in parity.compare(DEFAULT, _obs([]), raised)] == list(parity.CLAUSES)
    assert [d.clause for d in parity.compare(DEFAULT, raised, _obs([]))] == ["digest.torch_parity"]
    other = _obs([], error=("building the loader", "ValueError", "no"))
    (diff,) = parity.compare(DEFAULT, raised, other)
    assert diff.clause == "digest.torch_parity" and "ValueError" in diff.text and "TypeError" in diff.text


def test_a_schedule_orders_the_starts_on_one_clock_where_they_overlap():
    plan = parity.schedule_plan(Point(3, 2, schedule=(2, 0, 1)))
    assert {(f.worker, f.value, f.generation) for f in plan.faults} == {
        (2, 0.0, None), (0, parity.SCHEDULE_STEP_S, None), (1, 2 * parity.SCHEDULE_STEP_S, None)}
    assert parity.schedule_plan(Point(3, 1, schedule=(2, 0, 1))) is None
    assert parity.schedule_plan(Point(3, None)) is None


def _torch_run(point: Point, method: str) -> parity.Observation:
    with tempfile.TemporaryDirectory() as d, parity._seeded_globally(point), parity._no_accelerator_warning():
        return parity.run(lambda log: DataLoader(dataset_of(point, log), num_workers=point.num_workers,
                                                 multiprocessing_context=multiprocessing.get_context(method),
                                                 **loader_kwargs(point)), point, d, workers=set)


#: Points judged per context, torch against torch: 40 under fork in the self-tests (under a minute
#: here); `make parity-torch` judges 200 in every context
TORCH_POINTS = int(os.environ.get("WORKERSTART_TORCH_POINTS", "40"))
TORCH_METHODS = os.environ.get("WORKERSTART_TORCH_METHODS", "fork").split(",")
#: Where the suite runs torch's truth for a check's context (parity's docstring: not spawned)
TRUTH_METHOD = {"spawn": "forkserver"}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("torch_process_state")
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("method", TORCH_METHODS)
def test_torchs_own_dataloader_differs_from_itself_nowhere(method):
    """The judge's truth is torch: over drawn points of every dimension, two runs of torch's
    DataLoader (one of them as the loader under test would run) show no difference, so every
    difference the judge reports about a loader is the loader's. in_order=False points compare
    what does not depend on timing."""
    if "forkserver" in (method, TRUTH_METHOD.get(method)):  # forked from a server that imported torch, as the suite's
        from pytest_workerstart.harness.forkserver import warm_forkserver

        warm_forkserver()
    limits = space.Limits(usable_cores=2, parallel=False, persistent=True, in_order_kwarg=True)
    rng = random.Random(2026)
    seen = collections.Counter()
    for _ in range(TORCH_POINTS):
        point = space.SPACES["digest.first_batch"].draw(limits, rng)
        diffs = parity.compare(point, _torch_run(point, TRUTH_METHOD.get(method, method)), _torch_run(point, method))
        assert diffs == [], (point.text(), diffs)
        seen[point.dataset] += 1
    assert len(seen) == 3 or TORCH_POINTS < 20


def test_a_declared_difference_is_parsed_checked_and_never_drawn():
    from pytest_workerstart import protocol
    from pytest_workerstart.point import declared_different

    loader = protocol.resolve("torch", capability_overrides={"differs_from_torch": "shuffle, data=ITERABLE"})
    assert loader.capabilities["differs_from_torch"] == ("shuffle", "data=iterable")
    for bad, said in (("shuffles", "KEY or KEY=VALUE"), ("data=list", "'list' is not a value of data")):
        with pytest.raises(protocol.SpecError, match=said):
            protocol.resolve("torch", capability_overrides={"differs_from_torch": bad})
    items = loader.capabilities["differs_from_torch"]
    assert declared_different(Point(3, shuffle=True), items) == ["shuffle"]
    assert declared_different(Point(3, shuffle=False), items) == ["shuffle"]  # set, even to False: not torch's default
    assert declared_different(Point(3, dataset="getitems"), items) == []
    limits = space.Limits(usable_cores=2, parallel=False, persistent=True, in_order_kwarg=True, differs=items)
    rng = random.Random(3)
    drawn = [space.SPACES["order.epoch_shuffle"].draw(limits, rng) for _ in range(100)]
    assert not [p for p in drawn if declared_different(p, items)]


def test_a_point_declared_different_is_skipped_saying_so(pytester):
    result = pytester.runpytest_subprocess(
        "--workerstart", "--workerstart-loader=torch", "--workerstart-context=fork", "--workerstart-preflight=false",
        "--workerstart-capability=differs_from_torch=shuffle", "--workerstart-replay=N=2,len=4,shuffle=1",
        "-k", "epoch_shuffle_at and explore", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*skipped 1x: declared different: the replayed point sets shuffle*",
                                 "workerstart: declared different from torch: shuffle *"])
