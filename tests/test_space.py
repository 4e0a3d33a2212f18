"""The space of a check and the explorer, without a suite run: points parse back from their
text, the explorer finds and shrinks a region-confined failure with a pure judge, stops at its
budget, never raises, and the sharding clause's truth equals torch's own batches."""

import collections
import dataclasses
import multiprocessing

import pytest
from torch.utils.data import DataLoader

from pytest_workerstart import explore, space
from pytest_workerstart.conformance.sharding.test_sharding import _served, expected_batches
from pytest_workerstart.datasets import ShardedRange
from pytest_workerstart.space import Point


def test_a_point_is_its_text():
    p = Point(6, 3, "iterable", 31, None, False, 1, True, False, 2)
    assert space.parse(p.text()) == p
    assert space.parse("N=4,p=3") == Point(4, 3)
    assert Point(4, 3).text(("num_workers", "parallelism")) == "N=4,p=3"


@pytest.mark.parametrize("text, said", [("N=0", "expected 1..16"), ("q=1", "KEY one of"), ("p=x", "'x' is not"),
                                        ("data=list", "not a value of data"), ("N", "expected KEY=VALUE")])
def test_a_bad_point_says_what(text, said):
    with pytest.raises(space.PointError, match=said):
        space.parse(text)


def test_every_space_names_known_dimensions_and_its_corners_parse():
    for sp in space.SPACES.values():
        assert set(sp.dims) <= set(space.DIMENSIONS), sp.check_id
        for corner in sp.corners:
            point = corner.resolve(2)
            assert space.parse(point.text()) == point


def test_a_check_declares_its_own_corners_beside_its_id():
    sp = space.SPACES["sharding.exactly_once"]
    assert [c.id for c in sp.corners[:2]] == ["even", "uneven"] and sp.corners[2:] == space.DATA_CORNERS
    assert sp.corner("uneven").point == Point(3, 3, "iterable", 31, 2, persistent_workers=True, epochs=2)
    assert sp.corner("uneven").profiles == ("full",) and not sp.corner("even").collected


@pytest.mark.parametrize("spec, said", [({"why": "no point"}, "'at'"), ({"at": "N=3", "colour": 1}, "colour"),
                                        ({"at": "N=99"}, "expected 1..16")])
def test_a_bad_corner_declaration_says_which_and_why(monkeypatch, spec, said):
    from pytest_workerstart import registry

    monkeypatch.setattr(space.registry, "get", lambda i: registry.Check(i, "t", corners={"odd": spec}))
    with pytest.raises(ValueError, match=f"x.y: corner 'odd' is not .*{said}"):
        space._declared_corners("x.y")


def test_the_wide_corner_is_above_the_cores_and_at_least_twice_p():
    for cores in (1, 2, 4, 7):
        p = space.SPACES["start.respects_bound"].corner("wide").resolve(cores)
        assert p.parallelism > cores and p.num_workers >= min(2 * p.parallelism, space.MAX_WORKERS)


LIMITS = space.Limits(usable_cores=2, parallel=True, persistent=True, in_order_kwarg=True)


def _unbounded_from_three(point: Point) -> None:
    p, n = point.parallelism, point.num_workers
    assert not (p >= 3 and n > p), f"{n} starts at once"


def test_the_explorer_finds_and_shrinks_a_region_confined_failure():
    strategy = space.SPACES["start.respects_bound"].strategy(dataclasses.replace(LIMITS, max_workers=8))
    ex = explore.explore(strategy, _unbounded_from_three, seed=1, budget_s=5.0, min_points=300)
    assert ex.smallest_failure is not None, ex.judged
    assert ex.smallest_failure.point.text(("num_workers", "parallelism")) == "N=4,p=3"
    assert ex.stopped == "shrunk"
    reason = explore.reason(ex, ("num_workers", "parallelism"))
    assert reason.startswith("at N=4,p=3: 4 starts at once (explored with seed 1:"), reason


def test_the_explorer_stops_at_its_budget_and_judges_each_point_once():
    calls = collections.Counter()

    def judge(point):
        calls[point] += 1

    strategy = space.SPACES["start.respects_bound"].strategy(LIMITS)
    ex = explore.explore(strategy, judge, seed=2, budget_s=0.0, min_points=7)
    assert ex.smallest_failure is None and len(ex.judged) == 7 and ex.stopped.startswith("budget spent")
    assert set(calls.values()) == {1}


@pytest.mark.parametrize(("shrink", "points", "method", "cap"), [
    (5, 4, "fork", 5), (None, 4, "fork", 12), (None, 0, "fork", 0), (None, None, "spawn", explore.SPAWN_SHRINK_POINTS),
    (None, None, "fork", None)])
def test_one_rule_caps_a_shrink_whether_the_draws_are_its_own_or_a_streams(monkeypatch, shrink, points, method, cap):
    """--workerstart-explore-shrink-points, else 3 x --workerstart-explore-points, else a few under
    spawn, else the time alone: the same cap for a case's own draws and a shared stream's."""
    settings = type("S", (), {"explore_shrink_points": shrink, "explore_points": points})()
    env = type("E", (), {"settings": settings, "context_name": method})()
    sp = type("Sp", (), {"draw": None, "strategy": lambda self, limits: None})()
    caps = []
    monkeypatch.setattr(explore, "explore", lambda strategy, judge, **kw: caps.append(kw["shrink_points"]))
    explore._explore(env, sp, LIMITS, lambda p: None, seed=1, budget_s=5.0)
    explore._explore(env, sp, LIMITS, lambda p: None, seed=1, budget_s=float("inf"), points=3)
    assert caps == [cap, cap]


def test_a_judge_that_raises_anything_is_a_failing_point_not_an_error():
    def judge(point):
        if point.num_workers > 1:
            raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly")
        pytest.fail("a step was stopped")

    ex = explore.explore(space.SPACES["start.respects_bound"].strategy(LIMITS), judge, seed=3, budget_s=1.0)
    assert ex.smallest_failure.point.num_workers == 1
    assert ex.smallest_failure.failure == "a step was stopped"


DATA = space.SPACES["sharding.exactly_once"]


def _uniform(judge, seed=1, points=30, limits=LIMITS):
    return explore.explore_uniform(lambda rng: DATA.draw(limits, rng), lambda p: DATA.simpler(p, limits), judge,
                                   seed=seed, budget_s=float("inf"), min_points=points, max_points=points)


def test_the_data_path_draws_every_dimension_and_valid_points():
    ex = _uniform(lambda point: None, points=200)
    points = [j.point for j in ex.judged]
    assert len(points) == 200 and all(space.parse(p.text()) == p for p in points)
    for name in space.DATA_DIMS:
        assert len({getattr(p, name) for p in points}) > 1, name
    assert {p.sample for p in points} == set(space.SAMPLES)
    assert all((p.schedule is not None) == (p.parallelism > 1 and p.num_workers > 1) for p in points)
    assert not [p for p in points if p.dataset == "iterable" and (p.sampler or p.shuffle or p.batch_sampler)]


def test_one_seed_draws_the_same_points_for_every_judge():
    """What lets the checks of a stream share one observation per point: the draws do not
    depend on what the judge said, up to the first failure."""
    quiet = [j.point for j in _uniform(lambda point: None, seed=5).judged]
    fails = _uniform(lambda point: pytest.fail("x") if point == quiet[17] else None, seed=5)
    assert [j.point for j in fails.judged if j.origin == "drawn"] == quiet[:18]


def test_a_data_path_failure_is_shrunk_into_its_region_and_each_point_judged_once():
    calls = collections.Counter()

    def judge(point):
        calls[point] += 1
        assert not (point.sample in ("namedtuple", "nested") and point.num_workers >= 2), "a namedtuple lost"

    ex = _uniform(judge, seed=1)
    small = ex.smallest_failure.point
    assert ex.stopped == "shrunk" and small.sample in ("namedtuple", "nested") and small.num_workers == 2
    assert small == space.parse("N=2,p=1,len=1,batch=1,sample=" + small.sample)
    assert set(calls.values()) == {1}


def test_the_data_corners_are_valid_points_at_the_defaults_and_beyond():
    corners = {c.id: c.resolve(2) for c in space.DATA_CORNERS}
    assert all(space._valid(p, LIMITS) == p for p in corners.values())
    assert corners["default_map"] == Point(3, None, "map", 13, 2)
    wide = corners["wide"]
    assert wide.num_workers >= 5 and wide.parallelism > 2 and wide.num_workers >= 2 * wide.parallelism
    for name in space.DATA_DIMS:  # every dimension takes a value beside the default's somewhere
        assert len({getattr(p, name) for p in corners.values()}) > 1, name


def test_a_run_seed_gives_each_case_its_own_reproducible_stream():
    assert explore.case_seed(7, "a") == explore.case_seed(7, "a") != explore.case_seed(7, "b")


@pytest.mark.parametrize("point", [
    Point(3, None, "iterable", 31, 2, drop_last=True),
    Point(4, None, "iterable", 10, None),
    Point(2, None, "iterable", 7, 3, drop_last=False),
    Point(5, None, "iterable", 3, 2, drop_last=True),
], ids=lambda p: p.text(("num_workers", "length", "batch_size", "drop_last")))
@pytest.mark.usefixtures("torch_process_state")
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_sharding_truth_is_torchs(point):
    """expected_batches (computed in the test process) against torch's DataLoader, forked workers."""
    loader = DataLoader(ShardedRange(point.length), num_workers=point.num_workers,
                        multiprocessing_context=multiprocessing.get_context("fork"), **point.loader_kwargs())
    assert sorted(_served(b) for b in loader) == expected_batches(point)


def test_the_terminal_says_per_clause_which_points_were_judged():
    from pytest_workerstart.report import points_lines
    from pytest_workerstart.verdict import CheckRecord, Verdict

    def rec(nodeid, check_id, ctx, points, outcome="passed"):
        r = CheckRecord(nodeid, check_id, ctx, state="finished", outcome=outcome)
        r.measurements = {"points": [{"point": p, "origin": o} for p, o in points]}
        return r

    v = Verdict({}, {})
    built = "N=3,p=none,data=map,len=8,batch=2,drop_last=0,prefetch=none,persistent=0,in_order=none"
    for r in (rec("a", "start.respects_bound", "spawn", [("N=3,p=1", "corner")]),
              rec("b", "start.respects_bound", "fork", [("N=6,p=3", "corner")]),
              rec("c", "start.respects_bound", "fork", [("N=2,p=2", "drawn"), ("N=5,p=4", "shrink")]),
              rec("d", "start.default_serial", "fork", [(built, "fixed")]),
              rec("e", "start.parameter_validation", "fork", [(built.replace("p=none", "p='2'"), "fixed")]),
              rec("f", "digest.first_batch", "fork", [(built, "fixed"), (built.replace("map", "iterable"), "fixed")]),
              rec("g", "digest.torch_parity", "fork", [("N=9,p=none", "fixed")], outcome="skipped")):
        v.records[r.nodeid] = r
    judged = v.judged_points()
    assert "digest.torch_parity" not in judged  # a skipped case judged nothing
    assert judged["start.respects_bound"][0] == {"point": "N=2,p=2", "origin": "drawn", "contexts": ["fork"]}
    assert points_lines(judged, True) == [
        "workerstart: points digest: 2 fixed, none explored; N 3, p none, data iterable/map",
        "workerstart: points start: 4 fixed, 2 explored in fork; N 2/3/5/6, p 1/2/3/4/none"]
    del v.records["c"]
    assert points_lines(v.judged_points(), False)[1] == (
        "workerstart: points start: 4 fixed, none explored (--workerstart-explore=0); N 3/6, p 1/3/none")


def test_each_build_of_the_loader_is_recorded_as_its_point():
    """What the verdict lists for the checks without a declared space: the arguments each build
    got, read where the suite builds the loader (in the test process or a scenario process)."""
    from pytest_workerstart import protocol

    loader = protocol.resolve("reference")
    with space.recording() as outer:
        with space.recording() as inner:
            loader.make(ShardedRange(7), num_workers=0, batch_size=None)
        loader.make(list(range(5)), num_workers=2, parallelism=2, batch_size=3, drop_last=True, prefetch_factor=1,
                    persistent_workers=True, in_order=False)
        with pytest.raises(TypeError):  # a build that is refused was judged all the same
            loader.make(list(range(5)), num_workers=2, **{loader.parallelism_kwarg: "2"})
    assert inner == ["N=0,p=none,data=iterable,len=7,batch=none,drop_last=0,prefetch=none,persistent=0,in_order=none"]
    assert outer == [*inner,
                     "N=2,p=2,data=map,len=5,batch=3,drop_last=1,prefetch=1,persistent=1,in_order=0",
                     "N=2,p='2',data=map,len=5,batch=1,drop_last=0,prefetch=none,persistent=0,in_order=none"]
    loader.make(list(range(5)), num_workers=0)  # outside a recording: nothing kept
    assert len(outer) == 3


def test_a_scenario_process_reports_the_points_it_built():
    from pytest_workerstart import protocol
    from pytest_workerstart.session import preflight

    res = preflight.run(protocol.resolve("torch"), "fork", timeout=120, memory_limit=None)
    assert res.status == "ok", res.details()
    assert [space.parse(t).num_workers for t in res.built] == [2]


def test_every_dataloader_keyword_is_a_dimension_or_named_out_of_scope():
    import inspect

    keywords = set(inspect.signature(DataLoader.__init__).parameters) - {"self"}
    assert keywords == set(space.KEYWORD_DIMS) | set(space.OUT_OF_SCOPE), \
        sorted(keywords ^ (set(space.KEYWORD_DIMS) | set(space.OUT_OF_SCOPE)))
    assert set(space.KEYWORD_DIMS.values()) <= set(space.DATA_DIMS)


def test_the_contract_page_shows_the_space_table_as_it_runs():
    from tools import space_table

    assert space_table.PART.current(), (
        "docs/contract.md differs from pytest_workerstart/space.py: run `python -m tools.space_table --write`")
