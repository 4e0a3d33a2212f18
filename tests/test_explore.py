"""The configuration space in a suite run: loaders whose defect lives in one region of a check's
space are found, in a fixed corner or by the explorer, and shrunk into their region; the
reference passes every corner and every explored point; the reproduce command replays the
shrunk point; the verdict lists the points each case judged."""

import json
import shlex
import sys

import pytest

from pytest_workerstart import space
from pytest_workerstart.fixtures.broken import catalog
from pytest_workerstart.loader_spec import import_attr
from pytest_workerstart.reference import ParallelStartDataLoader
from tests import _batch, _warm
from tests.conftest import ONE_RUN
from tools.replay_failures import explored_failures

CATCHES, _ = catalog.load()
REGIONAL = {name: c for name, c in CATCHES.items() if c.region is not None}
#: Where each region lives, as a predicate on the shrunk point (the catalog's ``region`` in words).
IN_REGION = {
    "p>=3 and N>p": lambda pt: pt.parallelism >= 3 and pt.num_workers > pt.parallelism,
    "p>cores and N>cores": lambda pt: pt.parallelism > 2 and pt.num_workers > 2,
    "uneven shards": lambda pt: pt.uneven,
    "persistent and epochs>=2": lambda pt: pt.persistent_workers and pt.epochs >= 2,
    "drop_last": lambda pt: pt.drop_last,
    "in_order=0": lambda pt: pt.in_order is False,
    "namedtuple samples": lambda pt: pt.sample in ("namedtuple", "nested"),
    "getitems, unordered batches": lambda pt: pt.dataset == "getitems" and (pt.batch_size or 0) >= 2
    and (bool(pt.shuffle) or pt.sampler in ("random", "subset", "list")),
    "a sampler that permutes": lambda pt: pt.sampler in ("random", "subset", "list"),
    "batch_sampler, drop_last, a short last batch": lambda pt: pt.batch_sampler and pt.drop_last,
    "a collate_fn": lambda pt: pt.collate != "default",
    "worker_init_fn": lambda pt: pt.worker_init is not None,
    "a generator": lambda pt: pt.generator is not None,
    "pin_memory": lambda pt: pt.pin_memory,
    "timeout": lambda pt: pt.timeout > 0,
    "map-style, odd length, in order": lambda pt: pt.dataset != "iterable" and pt.length % 2 == 1
    and not (pt.sampler or pt.shuffle or pt.batch_sampler),
    "prefetch_factor given": lambda pt: pt.prefetch_factor is not None,
    "N>=4, p>=2, starts finishing out of id order": lambda pt: pt.num_workers >= 4 and pt.parallelism >= 2
    and pt.schedule is not None and list(pt.schedule) != sorted(pt.schedule),
}
#: A count of points, not seconds, with a fixed seed: the same draws however loaded the machine.
#: Draws stop at the first failure, so the count bounds the controls; a region loader is found
#: within it with seed 1 or by a corner (the explored case must fail where no corner does).
POINTS = 12
#: Shrink steps per explored failure: any failing point of a region loader lies in its region, and
#: shrinking to the smallest (up to 3N steps, the default) was two thirds of these batches' points.
SHRINK = 8
ARGS = ("--workerstart-context=forkserver", "--workerstart-profile=full", "--workerstart-preflight=false",
        f"--workerstart-explore-points={POINTS}", "--workerstart-explore-seed=1",
        f"--workerstart-explore-shrink-points={SHRINK}",
        "-k", "respects_bound or _at", *ONE_RUN)

#: Replays of a failure that depends on which worker's start finishes first
REPLAYS = 5
SLICES: dict = {}
#: The region loaders in batches (one suite run each, on the xdist worker of its class): the start and
#: sharding loaders with the reference's control, then the data path's on torch's DataLoader and
#: on the reference (whose explored points carry start schedules).
GROUPS = {
    "start_sharding": sorted(n for n, c in REGIONAL.items() if c.module.endswith(".regional")),
    "data_on_torch": sorted(n for n, c in REGIONAL.items() if c.module.endswith(".data_path")
                            and not issubclass(import_attr(c.spec), ParallelStartDataLoader)),
    "data_on_reference": sorted(n for n, c in REGIONAL.items() if c.module.endswith(".data_path")
                                and issubclass(import_attr(c.spec), ParallelStartDataLoader)),
}

pytestmark = pytest.mark.slow


def _judged(tmp_path_factory, group: str):
    if group not in SLICES:
        entries = {name: (REGIONAL[name].spec, REGIONAL[name].targets) for name in GROUPS[group]}
        if group == "start_sharding":
            entries["reference"] = ("reference", ("start.respects_bound", *space.DATA_CLAUSES))
        SLICES[group] = _batch.judge(tmp_path_factory.mktemp(f"regional-{group}"), entries, ARGS, timeout=1500)
    return SLICES[group]


def test_every_region_has_a_predicate_and_a_group():
    assert {c.region for c in REGIONAL.values()} <= set(IN_REGION)
    assert sorted(n for names in GROUPS.values() for n in names) == sorted(REGIONAL)


class RegionLoaders:
    """The region loaders of one group (subclasses below)."""

    group = ""

    @pytest.mark.timeout(3200)
    def test_a_region_confined_defect_is_found_and_shrunk_into_its_region(self, name, tmp_path_factory):
        _found_and_shrunk(name, _judged(tmp_path_factory, self.group)[name])


class TestStartAndShardingRegions(RegionLoaders):
    group = "start_sharding"

    @pytest.mark.timeout(3200)
    def test_the_reference_passes_every_corner_and_explored_point(self, tmp_path_factory):
        got = _judged(tmp_path_factory, "start_sharding")["reference"]
        assert got.finished() and got.failed_ids() == set(), got.describe()
        explored = [c for c in got.checks if c["nodeid"].endswith("-explore]")]
        # every point asked for, or every point there is (N 1..6, p 1..min(N + 1, cores + 2): 21 here)
        explorations = [c["measurements"]["exploration"] for c in explored]
        assert len(explored) == 1 + len(space.DATA_CLAUSES), explorations
        assert all(e["drawn"] == POINTS or e["stopped"] == "the space was exhausted" for e in explorations), \
            explorations


class TestDataPathRegionsOnTorch(RegionLoaders):
    group = "data_on_torch"


class TestDataPathRegionsOnTheReference(RegionLoaders):
    group = "data_on_reference"

    @pytest.mark.timeout(3200)
    def test_a_failure_that_depends_on_start_order_fails_on_every_replay(self, tmp_path_factory, tmp_path):
        """The explored failure of the loader that registers workers in completion order (from four
        workers) carries its start schedule: its reproduce command fails every time."""
        got = _judged(tmp_path_factory, "data_on_reference")["RegistersInCompletionOrderFromFour"]
        case = next(c for c in got.checks if c["nodeid"].endswith("-explore]") and c["outcome"] == "failed")
        point = space.parse(case["measurements"]["exploration"]["failing_point"])
        assert point.schedule is not None and point.parallelism > 1, point
        outcomes = []
        for k in range(REPLAYS):
            out = tmp_path / f"replay{k}.json"
            _warm.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--workerstart",
                       f"--workerstart-loader={REGIONAL['RegistersInCompletionOrderFromFour'].spec}",
                       "--workerstart-context=forkserver", "--workerstart-preflight=false",
                       f"--workerstart-replay={point.text()}", "-k", "registration_at and explore",
                       f"--workerstart-json={out}"], cwd=tmp_path, timeout=300)
            from tests.conftest import Verdict

            outcomes.append([c["outcome"] for c in Verdict(out, None).data["checks"]])
        assert outcomes == [["failed"]] * REPLAYS, outcomes


def pytest_generate_tests(metafunc):
    if metafunc.cls is not None and issubclass(metafunc.cls, RegionLoaders) and "name" in metafunc.fixturenames:
        metafunc.parametrize("name", GROUPS[metafunc.cls.group])


def _found_and_shrunk(name, got):
    catch = REGIONAL[name]
    assert got.finished(), got.describe()
    (target,) = catch.targets
    assert "failed" in got.outcomes(target), got.describe()
    for case in got.checks:
        if case["outcome"] != "failed" or not case["nodeid"].endswith("-explore]"):
            continue
        explored = case["measurements"]["exploration"]
        point = space.parse(explored["failing_point"])
        assert IN_REGION[catch.region](point), (name, explored)
        assert case["reason"].removeprefix("Failed: ").startswith(f"at {point.text(space.SPACES[target].dims)}: "), \
        case["reason"]
        assert f"--workerstart-replay={explored['failing_point']}" in shlex.split(case["reproduce"])
        judged = case["measurements"]["points"]
        assert judged and all(p["outcome"] in ("passed", "failed") for p in judged)
        assert sum(p["origin"] == "shrink" for p in judged) <= SHRINK, judged
    for case in got.checks:  # a corner's failure names its point too
        if case["outcome"] == "failed" and not case["nodeid"].endswith("-explore]"):
            corner = case["nodeid"].rpartition("-")[2].rstrip("]")
            point = case["measurements"]["points"][0]["point"]
            assert f"at {point} (corner {corner}): " in case["reason"], case["reason"]
    # the explorer-only regions: no fixed corner shows them, the explored case must
    explored = [c["outcome"] for c in got.checks if c["nodeid"].endswith("-explore]") and c["id"] == target]
    corners = [c["outcome"] for c in got.checks if not c["nodeid"].endswith("-explore]") and c["id"] == target]
    if "failed" not in corners:
        assert explored == ["failed"], got.describe()


@pytest.mark.timeout(600)
def test_the_reproduce_command_replays_the_shrunk_point(tmp_path):
    """A region loader on torch's DataLoader, under fork: the explored failure's reproduce
    command (run as printed) judges exactly the shrunk point, and fails there again. (Seed 1's
    stream for this case fails within its first draws.)"""
    spec = REGIONAL["DropsLastTwice"].spec
    out = tmp_path / "first.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--workerstart", f"--workerstart-loader={spec}",
           "--workerstart-context=fork", "--workerstart-explore-points=12", "--workerstart-explore-seed=1",
           "--workerstart-preflight=false", "-k", "exactly_once_at and explore", f"--workerstart-json={out}"]
    _warm.run(cmd, cwd=tmp_path, timeout=300)
    from tests.conftest import Verdict

    first = Verdict(out, None)
    case = next(c for c in first.data["checks"] if c["nodeid"].endswith("-explore]"))
    assert case["outcome"] == "failed", case
    rerun = shlex.split(case["reproduce"])
    assert rerun[0] == "pytest"
    again = tmp_path / "again.json"
    _warm.run([sys.executable, "-m", *rerun, "-p", "no:cacheprovider", f"--workerstart-json={again}"],
              cwd=tmp_path, timeout=300)
    replayed = Verdict(again, None).data["checks"]
    assert [c["outcome"] for c in replayed] == ["failed"], replayed
    point = case["measurements"]["exploration"]["failing_point"]
    judged = replayed[0]["measurements"]["points"]
    assert [(p["point"], p["outcome"], p["origin"]) for p in judged] == [(point, "failed", "replay")]
    assert replayed[0]["reason"].removeprefix("Failed: ").startswith(f"at {point} (replayed): ")
    assert not (tmp_path / ".hypothesis").exists(), "the explorer left hypothesis's cache in the working directory"


def test_a_bad_replay_point_is_one_usage_line(pytester):
    result = pytester.runpytest_subprocess("--workerstart", "--workerstart-replay=N=0,p=2", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--workerstart-replay: not a point: N=0: expected 1..16" in result.stderr.str()


def test_the_quick_profile_collects_no_explored_case(pytester):
    result = pytester.runpytest_subprocess("--workerstart", "--workerstart-profile=quick", "--co", "-q",
                                           "-k", "respects_bound or _at", *ONE_RUN)
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids and not [i for i in ids if "explore" in i], ids
    assert any("-wide]" in i for i in ids)


def test_replay_failures_picks_every_explored_failure_and_only_those(tmp_path):
    def case(nodeid, outcome, point=None):
        return {"nodeid": nodeid, "outcome": outcome, "reproduce": "pytest x",
                "measurements": {"exploration": {"failing_point": point}} if point else {}}

    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"checks": [case("a-explore]", "failed", "N=2,p=1"), case("b-explore]", "passed"),
                                              case("c-wide]", "failed"), case("d-explore]", "failed", "N=3,p=2")]}))
    assert [c["nodeid"] for c in explored_failures(verdict)] == ["a-explore]", "d-explore]"]
