"""The configurations a check judges: its dimensions, fixed corners and explored region.

One :class:`Space` per check whose truth depends on the loader's arguments: the
dimensions it varies (a subset of :class:`Point`'s fields), the fixed corners every
run of a profile judges, and the region the explorer draws further points from
(:mod:`pytest_workerstart.explore`, with hypothesis). Everything else (the cases
pytest collects, the explorer's draws, the verdict's list of judged points, the
replay option) derives from this table. Checks without an entry judge the fixed
configuration their clause module names. Pure data plus hypothesis strategies,
built on demand: the plugin imports this without hypothesis or torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pytest_workerstart import registry
from pytest_workerstart.point import (  # noqa: F401 (re-exported: a space's points are these)
    BY_KEY,
    CHOICES,
    DEFAULTS,
    DIMENSIONS,
    MAX_WORKERS,
    SAMPLES,
    SHOWN_WHEN_SET,
    Point,
    PointError,
    parse,
    without,
)


@dataclasses.dataclass(frozen=True)
class Corner:
    """A fixed point every run of the named profiles judges; ``derive`` computes it from the
    machine's usable cores (the start clause's p > cores corner)."""

    id: str
    point: Point | None = None
    derive: Callable[[int], Point] | None = None
    profiles: tuple[str, ...] = ("quick", "full")
    #: contexts it is judged in under the quick profile (None: those the check runs in)
    quick_contexts: tuple[str, ...] | None = None
    why: str = ""
    #: False: judged by the check's own function (a case that predates the space), not a ws_point case
    collected: bool = True

    def resolve(self, usable_cores: int) -> Point:
        return self.point if self.derive is None else self.derive(usable_cores)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What bounds the explorer's draws in one context for one loader."""

    usable_cores: int
    parallel: bool  # the loader declares parallel start in this context
    persistent: bool  # the loader honours persistent_workers
    in_order_kwarg: bool  # the loader takes an in_order keyword
    max_workers: int = 6
    iterable: bool = True  # the loader takes an IterableDataset
    timeout: bool = True  # the loader honours timeout=
    worker_init: bool = True  # the loader calls worker_init_fn
    differs: tuple[str, ...] = ()  # differs_from_torch: what the data path never draws


@dataclasses.dataclass(frozen=True)
class Space:
    check_id: str
    dims: tuple[str, ...]
    corners: tuple[Corner, ...]
    #: Limits -> a hypothesis strategy of Points, which draws and shrinks (None: see ``draw``)
    strategy: Callable[[Limits], Any] | None = None
    #: (Limits, random.Random) -> a Point drawn uniformly; with ``simpler`` (Point, Limits) -> the
    #: points one step simpler, most simplifying first, which shrink a failure (None: see ``strategy``)
    draw: Callable[[Limits, Any], Point] | None = None
    simpler: Callable[[Point, Limits], list[Point]] | None = None
    #: the explored stream the check shares with others (one seed, one budget, one observation
    #: per point for all of them); None: its own
    stream: str | None = None

    def corner(self, corner_id: str) -> Corner:
        return next(c for c in self.corners if c.id == corner_id)

    @property
    def explorable(self) -> bool:
        return self.strategy is not None or self.draw is not None


# --- the points each case judged ----------------------------------------------------------

#: What a build of the loader shows (epochs are how often it is iterated, not an argument).
BUILD_DIMS: tuple[str, ...] = tuple(d for d in DIMENSIONS if d != "epochs")
_log: list[str] | None = None


def built(dataset: Any, parallelism: Any, kwargs: Mapping[str, Any]) -> Point:
    """The point a build of the loader under test is at, read from the arguments it was given
    (torch's defaults where one is not passed)."""
    from torch.utils.data import IterableDataset

    try:
        length = len(dataset)
    except Exception:  # no len() (an iterable), or one that cannot tell yet: recorded as unknown
        length = None
    return Point(num_workers=kwargs.get("num_workers", 0), parallelism=parallelism,
                 dataset="iterable" if isinstance(dataset, IterableDataset) else "map", length=length,
                 batch_size=kwargs.get("batch_size", 1), drop_last=kwargs.get("drop_last", False),
                 prefetch_factor=kwargs.get("prefetch_factor"),
                 persistent_workers=kwargs.get("persistent_workers", False), in_order=kwargs.get("in_order"))


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect the points (texts over :data:`BUILD_DIMS`) of the loaders built inside; nested
    recordings pass theirs on to the enclosing one, so a shared run counts for both."""
    global _log
    outer, _log = _log, []
    try:
        yield _log
    finally:
        mine, _log = _log, outer
        if outer is not None:
            outer.extend(mine)


def recorded() -> list[str]:
    """The points recorded so far: what a scenario that is about to be killed hands over early."""
    return list(_log or ())


def note(points: Iterable[str]) -> None:
    """Add points judged elsewhere (a scenario process, a run shared with an earlier case)."""
    if _log is not None:
        _log.extend(points)


def note_build(dataset: Any, parallelism: Any, kwargs: Mapping[str, Any]) -> None:
    if _log is not None:
        _log.append(built(dataset, parallelism, kwargs).text(BUILD_DIMS))


# --- the start clause ------------------------------------------------------------------


def _wide(usable_cores: int) -> Point:
    """p above the usable cores and N at least twice p: the bound is logical, not physical."""
    p = max(3, usable_cores + 1)
    return Point(num_workers=min(2 * p, MAX_WORKERS), parallelism=p, length=2 * min(2 * p, MAX_WORKERS))


def _bound_points(limits: Limits):
    from hypothesis import strategies as st

    top = max(limits.max_workers, limits.usable_cores + 2)

    @st.composite
    def draw(d):
        n = d(st.integers(1, min(top, MAX_WORKERS)))
        p = d(st.integers(1, min(n + 1, limits.usable_cores + 2)))
        return Point(num_workers=n, parallelism=p, length=2 * n)

    return draw()


# --- the data path: every argument torch's DataLoader takes -------------------------------

#: What the data-path clauses vary: every Point field (docs/contract.md names the DataLoader
#: keywords that are not dimensions, with why).
DATA_DIMS: tuple[str, ...] = tuple(DIMENSIONS)
#: The data-path clauses, judged at the same points by one differential judge (pytest_workerstart.parity).
DATA_CLAUSES = ("sharding.exactly_once", "digest.first_batch", "digest.torch_parity", "order.registration",
                "order.epoch_shuffle", "order.worker_seeds", "order.rng_streams", "persistent.reuse",
                "prefetch.bound", "transfer.shared_memory")
#: Each keyword of torch's DataLoader that is a dimension -> its Point field.
KEYWORD_DIMS = {"dataset": "dataset", "batch_size": "batch_size", "shuffle": "shuffle", "sampler": "sampler",
                "batch_sampler": "batch_sampler", "num_workers": "num_workers", "collate_fn": "collate",
                "pin_memory": "pin_memory", "drop_last": "drop_last", "timeout": "timeout",
                "worker_init_fn": "worker_init", "generator": "generator", "prefetch_factor": "prefetch_factor",
                "persistent_workers": "persistent_workers", "in_order": "in_order"}
#: DataLoader keywords that are no dimension of a point, and why.
OUT_OF_SCOPE = {
    "multiprocessing_context": "the run's context (--workerstart-context): every check runs in each selected one",
    "pin_memory_device": "pinning needs an accelerator; the suite's machines have none (pin=1 is judged: torch "
                         "then pins nothing, and neither may the loader change the batches)",
}


def _wide_data(usable_cores: int) -> Point:
    """N >= 5, p above the usable cores and N >= 2p, shuffled, workers finishing their starts last first."""
    p = max(3, usable_cores + 1)
    n = max(5, min(2 * p, MAX_WORKERS))
    return Point(n, p, "map", 2 * n + 1, 2, shuffle=True, generator=7, schedule=tuple(reversed(range(n))))


def _draw_data(limits: Limits, rng) -> Point:
    """A point over every dimension, each value equally likely (hypothesis's generation favours
    the simplest values: at 30 draws it named a namedtuple sample 0, 0 and 7 times for seeds 1-3),
    map-style (with and without ``__getitems__``) and iterable. Where starts overlap (p > 1) a
    start schedule is always drawn, so a failure that depends on it replays."""
    kind = rng.choice(("map", "getitems", "iterable") if limits.iterable else ("map", "getitems"))
    n = rng.randint(1, limits.max_workers)
    p = rng.randint(1, min(n + 1, limits.usable_cores + 2)) if limits.parallel else None
    batch = rng.choice((None, 1, 2, 3, 4, 5))
    mapped = kind != "iterable"
    sampler = rng.choice((None, "seq", "random", "subset", "list")) if mapped else None
    return _valid(without(Point(
        num_workers=n, parallelism=p, dataset=kind, length=rng.randint(1, 40), batch_size=batch,
        drop_last=rng.random() < 0.5, prefetch_factor=rng.choice((None, 1, 2, 3, 4)),
        persistent_workers=limits.persistent and rng.random() < 0.5,
        in_order=rng.choice((None, True, False)) if limits.in_order_kwarg else None,
        epochs=rng.randint(1, 3), shuffle=rng.choice((None, False, True)) if sampler is None else None,
        sampler=sampler, batch_sampler=rng.random() < 0.5, collate=rng.choice(CHOICES["collate"]),
        pin_memory=rng.random() < 0.5, timeout=rng.choice((0, 30)) if limits.timeout else 0,
        worker_init=rng.choice((None, "reseed")) if limits.worker_init else None,
        generator=rng.choice((None, rng.randint(0, 2**16))), sample=rng.choice(SAMPLES),
        schedule=tuple(rng.sample(range(n), n))), limits.differs), limits)


def _valid(point: Point, limits: Limits) -> Point:
    """``point`` made one torch takes: what an iterable or unbatched point cannot have dropped,
    p at most min(N + 1, cores + 2), a schedule of all N workers exactly where starts overlap."""
    changes: dict[str, Any] = {}
    if point.dataset == "iterable":
        changes.update(sampler=None, shuffle=None, batch_sampler=False)
    if point.batch_size is None:
        changes.update(drop_last=False, batch_sampler=False, collate="default")
    n, p = point.num_workers, point.parallelism
    if p is not None:
        p = changes["parallelism"] = min(p, n + 1, limits.usable_cores + 2)
    if p is None or p <= 1 or n <= 1:
        changes["schedule"] = None
    else:
        order = point.schedule or tuple(range(n))
        changes["schedule"] = tuple(w for w in order if w < n) + tuple(w for w in range(n) if w not in order)
    return dataclasses.replace(point, **changes)


def _smaller(x: int | None) -> list[int]:
    """1, half and one less than ``x`` (those below it)."""
    return [v for v in dict.fromkeys((1, x // 2, x - 1)) if 1 <= v < x] if x else []


#: Each dimension's simpler values, most simplifying first (a shrink tries them in this order).
_SIMPLER: dict[str, Callable[[Any], list[Any]]] = {
    "num_workers": _smaller, "parallelism": _smaller, "length": _smaller, "batch_size": _smaller,
    "epochs": _smaller, "dataset": lambda d: ["map"], "schedule": lambda s: [tuple(sorted(s))] if s else [],
}


def _simpler_data(point: Point, limits: Limits) -> list[Point]:
    """The valid points simpler than ``point``: first every keyword it sets back at torch's default
    at once, then each half of them (a failure that needs none or few of them shrinks in a step
    or two), then one dimension at a time: a keyword back to its default, a count smaller, the
    map-style dataset, the schedule in id order."""
    out: list[Point] = []
    keywords = [name for name in DATA_DIMS if name in SHOWN_WHEN_SET and name != "schedule"
                and getattr(point, name) != DEFAULTS[name]]
    half = len(keywords) // 2
    for group in (keywords, keywords[:half], keywords[half:]) if len(keywords) > 1 else ():
        cand = _valid(dataclasses.replace(point, **{name: DEFAULTS[name] for name in group}), limits)
        if group and cand != point and cand not in out:
            out.append(cand)
    for name in DATA_DIMS:
        value = getattr(point, name)
        candidates = _SIMPLER[name](value) if name in _SIMPLER else [DEFAULTS[name]]
        for v in candidates:
            cand = _valid(dataclasses.replace(point, **{name: v}), limits)
            if v != value and cand != point and cand not in out:
                out.append(cand)
    return out


#: The corners every data-path clause judges: the defaults (what ``DataLoader(ds, batch_size=B,
#: num_workers=N)`` does) map-style and iterable, the wide corner, and every keyword's
#: non-default values (in the full profile).
DATA_CORNERS = (
    Corner("default_map", Point(3, None, "map", 13, 2),
           why="DataLoader(ds, batch_size=2, num_workers=3): every other argument torch's default"),
    Corner("default_iterable", Point(3, None, "iterable", 13, 2), profiles=("full",),
           why="the defaults over an iterable dataset with uneven shards"),
    Corner("wide", derive=_wide_data, profiles=("full",),
           why="N >= 5 workers, p > usable cores and N >= 2p, the last worker's start finishing first"),
    Corner("keywords_map", Point(5, 2, "getitems", 23, 3, True, 1, True, True, 2, shuffle=True, collate="wrap",
                                 pin_memory=True, timeout=30, worker_init="reseed", generator=11, sample="nested",
                                 schedule=(4, 2, 0, 3, 1)), profiles=("full",),
           why="`__getitems__`, shuffle, drop_last, prefetch 1, persistent, in_order, a collate_fn, pin_memory, "
               "timeout, worker_init_fn, a generator, nested samples over two epochs"),
    Corner("samplers_map", Point(4, 4, "map", 17, 2, True, in_order=False, epochs=2, sampler="subset",
                                 batch_sampler=True, collate="list", sample="namedtuple",
                                 schedule=(1, 3, 0, 2)), profiles=("full",),
           why="a subset sampler inside a batch_sampler that drops a short last batch, in_order=False, a list "
               "collate_fn, torch's global generator"),
    Corner("keywords_iterable", Point(5, 3, "iterable", 22, None, False, 3, True, None, 2, worker_init="reseed",
                                      generator=5, sample="dict", schedule=(2, 0, 4, 1, 3)), profiles=("full",),
           why="no automatic batching, prefetch 3, persistent workers over uneven shards"),
)


def _declared_corners(check_id: str) -> tuple[Corner, ...]:
    """The corners a check declares beside its id (``@check(ID, ..., corners={...})``)."""
    out = []
    for corner_id, spec in registry.get(check_id).corners.items():
        fields = {k: v for k, v in spec.items() if k != "at"}
        try:
            out.append(Corner(corner_id, parse(spec["at"]), **fields))
        except (KeyError, TypeError, PointError) as exc:
            raise ValueError(f"{check_id}: corner {corner_id!r} is not {{'at': POINT_TEXT, 'why': ..., "
                             f"'profiles': (...), 'collected': bool}}: {exc}") from None
    return tuple(out)


def _data_space(check_id: str) -> Space:
    return Space(check_id, DATA_DIMS, _declared_corners(check_id) + DATA_CORNERS, draw=_draw_data,
                 simpler=_simpler_data, stream="data")


SPACES: dict[str, Space] = {s.check_id: s for s in (
    Space("start.respects_bound", ("num_workers", "parallelism"), (
        Corner("p1", Point(3, 1)), Corner("p2", Point(3, 2)), Corner("p3", Point(3, 3)),
        Corner("wide", derive=_wide, quick_contexts=("forkserver",),
               why="N >= 2p and p > usable cores: an unbounded start and a bound of p differ"),
    ), _bound_points),
    *(_data_space(c) for c in DATA_CLAUSES),
)}


def get(check_id: str) -> Space | None:
    return SPACES.get(check_id)
