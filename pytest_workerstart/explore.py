"""Judge a check at points of its space: a fixed corner, a replayed point, or points drawn
and shrunk by hypothesis within a time budget.

A clause gives a judge, ``judge(point)``, that raises (an assertion, ``pytest.fail``, a
stopped step) where the loader is wrong at that point. The explorer draws points from
the check's :class:`~pytest_workerstart.space.Space`, judges each once (a point drawn
again replays its outcome, so hypothesis's shrinker and its final replay see one answer
per point), and once one fails lets hypothesis shrink it to the smallest point that
still fails. Time is bounded twice: new draws stop when the budget is spent, shrinking
when its own budget is; the smallest failing point judged so far is then the answer.
Replaying a point needs no hypothesis database: the verdict carries the point itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import tempfile
import time
import zlib
from collections.abc import Callable

import pytest

from pytest_workerstart import protocol, space
from pytest_workerstart.cores import usable_cores
from pytest_workerstart.point import declared_different
from pytest_workerstart.space import Point
from pytest_workerstart.verdict import record_measurements

#: Points judged whatever the budget (under spawn: the only draws), so a seed's first
#: draws are judged on any machine however slow.
MIN_POINTS = 5
SPAWN_POINTS = 2
#: Shrinking may take this many times the exploration budget (at least SHRINK_FLOOR_S).
SHRINK_FACTOR, SHRINK_FLOOR_S = 3.0, 20.0
#: Points a shrink may judge under spawn (each boots its workers).
SPAWN_SHRINK_POINTS = 6
#: With --workerstart-explore-points=N, a shrink may judge this many times N points.
SHRINK_POINTS_FACTOR = 3


@dataclasses.dataclass
class Judged:
    point: Point
    failure: str | None  # the first line of what failed; None: passed
    seconds: float
    origin: str  # corner | drawn | shrink | replay
    #: the failure's whole text (the first line is ``failure``)
    detail: str = ""

    def as_json(self, dims: tuple[str, ...]) -> dict:
        return {"point": self.point.text(dims), "outcome": "failed" if self.failure else "passed",
                "origin": self.origin, "seconds": round(self.seconds, 2)}


@dataclasses.dataclass
class Exploration:
    seed: int
    budget_s: float
    judged: list[Judged]
    first_failure: Judged | None = None
    smallest_failure: Judged | None = None
    stopped: str = ""

    @property
    def drawn(self) -> int:
        return sum(1 for j in self.judged if j.origin == "drawn")


class _Spent(BaseException):
    """Raised through hypothesis (which only catches Exception) when a budget is spent."""


class _PointFailed(AssertionError):
    """The one failure type and site hypothesis sees, whatever the judge raised."""


def case_seed(run_seed: int, nodeid: str) -> int:
    """Each case's own stream of draws, reproducible from the run's seed."""
    return zlib.crc32(f"{run_seed}:{nodeid}".encode())


def judge_once(judge: Callable[[Point], None], point: Point, origin: str) -> Judged:
    t0 = time.monotonic()
    try:
        judge(point)
        failure, text = None, ""
    except (Exception, pytest.fail.Exception) as exc:  # skips and interrupts go through
        text = str(getattr(exc, "msg", None) or exc).strip()
        failure = (text.splitlines() or [""])[0][:400] or type(exc).__name__
        text = "\n".join(text.splitlines()[1:])
        del exc  # its traceback holds the point's loader and workers
        gc.collect()
    return Judged(point, failure, time.monotonic() - t0, origin, text)


def explore(strategy, judge: Callable[[Point], None], *, seed: int, budget_s: float,
            min_points: int = MIN_POINTS, max_points: int | None = None,
            shrink_points: int | None = None) -> Exploration:
    """Draw points from ``strategy`` until ``budget_s`` is spent (at least ``min_points``, at
    most ``max_points``), shrink the first failure; never raises for a failing point."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hseed

    result = Exploration(seed, budget_s, [])
    seen: dict[Point, Judged] = {}
    start = time.monotonic()
    shrink_start: list[float] = []
    shrink_budget = max(SHRINK_FLOOR_S, SHRINK_FACTOR * budget_s)

    def run(point: Point) -> None:
        judged = seen.get(point)
        if judged is None:
            if result.first_failure is None:
                drawn = len(result.judged)
                if drawn >= min_points and (time.monotonic() - start > budget_s
                                            or (max_points is not None and drawn >= max_points)):
                    result.stopped = f"budget spent ({drawn} points)"
                    raise _Spent
                origin = "drawn"
            else:
                shrinks = sum(1 for j in result.judged if j.origin == "shrink")
                if time.monotonic() - shrink_start[0] > shrink_budget or (
                        shrink_points is not None and shrinks >= shrink_points):
                    result.stopped = f"shrink budget spent ({shrinks} shrink steps)"
                    raise _Spent
                origin = "shrink"
            judged = seen[point] = judge_once(judge, point, origin)
            result.judged.append(judged)
            if judged.failure is not None:
                if result.first_failure is None:
                    result.first_failure = judged
                    shrink_start.append(time.monotonic())
                # hypothesis only tries smaller points than the smallest failure so far
                result.smallest_failure = judged
        if judged.failure is not None:
            raise _PointFailed(judged.failure)

    test = settings(database=None, deadline=None, max_examples=10_000, phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False,
                    report_multiple_bugs=False)(hseed(seed)(given(strategy)(run)))
    with _no_storage_in_cwd():
        try:
            test()
            result.stopped = result.stopped or "the space was exhausted"
        except _PointFailed:
            result.stopped = result.stopped or "shrunk"
        except _Spent:
            pass
    return result


def explore_uniform(draw: Callable[[random.Random], Point], simpler: Callable[[Point], list[Point]],
                    judge: Callable[[Point], None], *, seed: int, budget_s: float, min_points: int = MIN_POINTS,
                    max_points: int | None = None, shrink_points: int | None = None,
                    shrink_s: float | None = None) -> Exploration:
    """Draw points with ``draw`` from a generator seeded with ``seed`` until ``budget_s`` is spent
    (at least ``min_points``, at most ``max_points``) or one fails; then shrink it greedily: the
    first of ``simpler(point)`` that still fails replaces it, until none does or the shrink
    budget is spent. The draws do not depend on the judge: one seed gives the same points to
    every judge, so checks that share a stream judge the same observations. Never raises for a
    failing point."""
    rng = random.Random(seed)
    result = Exploration(seed, budget_s, [])
    seen: dict[Point, Judged] = {}
    start, repeats = time.monotonic(), 0
    while True:
        drawn = len(result.judged)
        if drawn >= min_points and (time.monotonic() - start > budget_s
                                    or (max_points is not None and drawn >= max_points)):
            result.stopped = f"budget spent ({drawn} points)"
            break
        point = draw(rng)
        if point in seen:
            repeats += 1
            if repeats > 20 * (drawn + 10):
                result.stopped = "the space was exhausted"
                break
            continue
        judged = seen[point] = judge_once(judge, point, "drawn")
        result.judged.append(judged)
        if judged.failure is not None:
            result.first_failure = result.smallest_failure = judged
            break
    if result.first_failure is None:
        return result
    shrink_start = time.monotonic()
    limit_s = shrink_s if shrink_s is not None else max(SHRINK_FLOOR_S, SHRINK_FACTOR * budget_s)
    steps, improved = 0, True
    while improved:
        improved = False
        for cand in simpler(result.smallest_failure.point):
            judged = seen.get(cand)
            if judged is None:
                if time.monotonic() - shrink_start > limit_s or (shrink_points is not None and steps >= shrink_points):
                    result.stopped = f"shrink budget spent ({steps} shrink steps)"
                    return result
                judged = seen[cand] = judge_once(judge, cand, "shrink")
                result.judged.append(judged)
                steps += 1
            if judged.failure is not None:
                result.smallest_failure, improved = judged, True
                break
    result.stopped = "shrunk"
    return result


@contextlib.contextmanager
def _no_storage_in_cwd():
    """hypothesis caches what it reads from source files in ``.hypothesis/`` of the working
    directory (even without a database): the suite leaves nothing in a user's project, so
    that cache goes to a temporary directory for the exploration, and the user's setting
    (their own tests may use hypothesis) is put back."""
    from hypothesis import configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="ws-hypothesis-") as home:
        configuration.set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


def reason(ex: Exploration, dims: tuple[str, ...]) -> str:
    """The verdict's reason for an exploration that found a failing point."""
    small, first = ex.smallest_failure, ex.first_failure
    steps = sum(1 for j in ex.judged if j.origin == "shrink")
    origin = (f"explored with seed {ex.seed}: {ex.drawn} points drawn, the failure shrunk from "
              f"{first.point.text(dims)} in {steps} steps" if small is not first
              else f"explored with seed {ex.seed}: {ex.drawn} points drawn")
    return f"at {small.point.text(dims)}: {small.failure} ({origin})"


# --- the cases of a check with a declared space ----------------------------------------

#: The case id of a check's explored points (or of a replayed one).
EXPLORE_CASE = "explore"
_RUN_SEED: list[int] = []


def run_seed(settings) -> int:
    """The run's seed: the option's, else one drawn once per process."""
    if settings.explore_seed is not None:
        return settings.explore_seed
    if not _RUN_SEED:
        import random

        _RUN_SEED.append(random.SystemRandom().randrange(2**31))
    return _RUN_SEED[0]


def cases(check_id: str, settings) -> list[str]:
    """The ``ws_point`` case ids pytest collects for ``check_id``: its corners, then the explored case
    where the budget is above 0 or a point is replayed."""
    sp = space.SPACES[check_id]
    ids = [c.id for c in sp.corners if c.collected]
    if sp.explorable and (settings.explores or settings.replay):
        ids.append(EXPLORE_CASE)
    return ids


def limits_for(env):
    return space.Limits(usable_cores=usable_cores(), parallel=env.parallel_start_here,
                        persistent=env.loader.has("persistent_workers"),
                        in_order_kwarg=protocol.accepts_kwarg(env.loader.factory, "in_order"),
                        max_workers=3 if env.context_name == "spawn" else 6,
                        iterable=env.loader.has("iterable_dataset"), timeout=env.loader.has("timeout"),
                        worker_init=env.loader.has("worker_init_fn"),
                        differs=tuple(env.loader.capabilities.get("differs_from_torch", ())))


def _here(env, point: Point) -> Point:
    """``point`` as judged in this context for this loader: no parallelism keyword (nor start
    schedule) where the loader declares no parallel start (as every check passes it), and no
    argument whose capability the loader does not declare."""
    limits = limits_for(env)
    changes: dict = {}
    if point.parallelism is not None and not limits.parallel:
        changes.update(parallelism=None, schedule=None)
    if point.in_order is not None and not limits.in_order_kwarg:
        changes["in_order"] = None
    if point.persistent_workers and not limits.persistent:
        changes["persistent_workers"] = False
    if point.timeout and not limits.timeout:
        changes["timeout"] = 0
    if point.worker_init is not None and not limits.worker_init:
        changes["worker_init"] = None
    return dataclasses.replace(point, **changes) if changes else point


def _judge_naming(judge: Callable[[Point], None], point: Point, where: str) -> None:
    """``judge(point)``; a failure's first line starts with ``where`` (the exception is kept:
    a stopped step stays one, with its cleanup)."""
    try:
        judge(point)
    except pytest.fail.Exception as exc:
        exc.msg = f"{where}: {exc.msg}"
        raise
    except AssertionError as exc:
        exc.args = (f"{where}: {exc.args[0] if exc.args else ''}", *exc.args[1:])
        raise


def judge_case(env, case: str, judge: Callable[[Point], None],
               survey: Callable[[Point], None] | None = None) -> None:
    """Judge ``case`` of the running check: a corner, the replayed point, or an exploration;
    the points judged go into the verdict (``points``), a failure names its point first.

    A check of a shared stream gives ``survey``, which observes a point for every check of the
    stream and never fails: the first of them to explore in a context surveys the stream's draws
    within the budget, and each then judges those same draws (observed once) and shrinks its own
    failure."""
    node = env.request.node
    check_id = node.get_closest_marker("workerstart_check").args[0]
    sp = space.SPACES[check_id]
    if case != EXPLORE_CASE:
        corner = sp.corner(case)
        if env.settings.profile not in corner.profiles:
            pytest.skip(f"{env.settings.profile} profile: corner {case} is judged in the "
                        f"{' and '.join(corner.profiles)} profile")
        if env.settings.profile == "quick" and corner.quick_contexts and env.context_name not in corner.quick_contexts:
            pytest.skip(f"quick profile: corner {case} is judged under {', '.join(corner.quick_contexts)}")
        point = _here(env, corner.resolve(usable_cores()))
        if point.dataset == "iterable" and not env.loader.has("iterable_dataset"):
            pytest.skip(f"corner {case} iterates an IterableDataset: the loader does not declare iterable_dataset")
        _skip_declared(env, sp, point, f"corner {case}")
        record_measurements(node, points=[{"point": point.text(sp.dims), "origin": "corner"}])
        _judge_naming(judge, point, f"at {point.text(sp.dims)} (corner {case})")
        return
    if env.settings.replay:
        point = _here(env, space.parse(env.settings.replay))
        _skip_declared(env, sp, point, "the replayed point")
        judged = judge_once(judge, point, "replay")
        record_measurements(node, points=[judged.as_json(sp.dims)])
        if judged.failure:
            pytest.fail(f"at {point.text(sp.dims)} (replayed): {judged.failure}\n{judged.detail}", pytrace=False)
        return
    limits = limits_for(env)
    if sp.stream is not None and survey is not None:
        seed, drawn = _surveyed(env, sp, limits, survey)
        ex = _explore(env, sp, limits, judge, seed, float("inf"), points=drawn)
        ex.budget_s = STREAM_BUDGET_FACTOR * env.settings.explore_budget  # the survey's, which chose the draws
    else:
        seed = case_seed(run_seed(env.settings), node.nodeid)
        ex = _explore(env, sp, limits, judge, seed, env.settings.explore_budget)
    n = env.settings.explore_points
    failed = ex.smallest_failure
    record_measurements(node, points=[j.as_json(sp.dims) for j in ex.judged], exploration={
        "seed": seed, "run_seed": run_seed(env.settings), "budget_s": None if n is not None else ex.budget_s,
        "budget_points": n, "drawn": ex.drawn, "stopped": ex.stopped, "declared_different": list(limits.differs),
        "failing_point": failed.point.text(sp.dims) if failed else None})
    if failed is not None:
        pytest.fail(f"{reason(ex, sp.dims)}\n{failed.detail}", pytrace=False)


#: A shared stream's budget in multiples of --workerstart-explore (it serves several checks).
STREAM_BUDGET_FACTOR = 3
STREAMS = pytest.StashKey[dict]()


def _shrink_points(env) -> int | None:
    """Simpler points a shrink may judge: --workerstart-explore-shrink-points, else 3 x
    --workerstart-explore-points, else (a time budget) a few under spawn, where each boots its
    workers; None: only the shrink's time bounds it."""
    if env.settings.explore_shrink_points is not None:
        return env.settings.explore_shrink_points
    n = env.settings.explore_points
    if n is not None:
        return SHRINK_POINTS_FACTOR * n
    return SPAWN_SHRINK_POINTS if env.context_name == "spawn" else None


def _explore(env, sp, limits, judge, seed: int, budget_s: float, points: int | None = None) -> Exploration:
    """Explore ``sp`` in this context within ``budget_s`` (or exactly ``points`` draws, or
    --workerstart-explore-points'): the same draws on any machine where points are counted."""
    n = points if points is not None else env.settings.explore_points
    spawn = env.context_name == "spawn"
    if n is not None:
        bounds = dict(budget_s=float("inf"), min_points=n, max_points=n, shrink_points=_shrink_points(env))
    else:
        bounds = dict(budget_s=budget_s, min_points=SPAWN_POINTS if spawn else MIN_POINTS,
                      max_points=SPAWN_POINTS if spawn else None, shrink_points=_shrink_points(env))
    if sp.draw is not None:
        shrink_s = max(SHRINK_FLOOR_S, SHRINK_FACTOR * STREAM_BUDGET_FACTOR * env.settings.explore_budget)
        return explore_uniform(lambda rng: sp.draw(limits, rng), lambda p: sp.simpler(p, limits), judge,
                               seed=seed, shrink_s=shrink_s, **bounds)
    return explore(sp.strategy(limits), judge, seed=seed, **bounds)


def _surveyed(env, sp, limits, survey: Callable[[Point], None]) -> tuple[int, int]:
    """(seed, points drawn) of ``sp``'s stream for this loader and context, surveyed on first use:
    each check of the stream then draws the same points from the same seed and judges them
    (observed once) until its own first failure, which it then shrinks."""
    cache = env.request.config.stash.setdefault(STREAMS, {})
    key = (env.loader.spec, env.context_name, sp.stream)
    if key not in cache:
        seed = case_seed(run_seed(env.settings), f"{sp.stream}:{env.loader.spec}:{env.context_name}")
        ex = _explore(env, sp, limits, survey, seed, STREAM_BUDGET_FACTOR * env.settings.explore_budget)
        cache[key] = (seed, ex.drawn)
    return cache[key]


def _skip_declared(env, sp, point: Point, what: str) -> None:
    """Skip a data-path point the loader declares its own semantics at (``differs_from_torch``):
    the verdict shows it as declared different, not as passed."""
    hit = declared_different(point, tuple(env.loader.capabilities.get("differs_from_torch", ()))) \
        if sp.stream is not None else []
    if hit:
        record_measurements(env.request.node, declared_different=hit)
        pytest.skip(f"declared different: {what} sets {', '.join(hit)}, where the loader declares differs_from_torch "
                    "(its own semantics, not judged against torch's DataLoader)")
