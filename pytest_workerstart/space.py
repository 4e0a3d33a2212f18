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

#: Point field -> (short key in a point's text, what it is)
DIMENSIONS: dict[str, tuple[str, str]] = {
    "num_workers": ("N", "num_workers"),
    "parallelism": ("p", "the parallelism keyword's value (none: not passed)"),
    "dataset": ("data", "map (indexable) or iterable (sharded by get_worker_info())"),
    "length": ("len", "samples in the dataset; an iterable's shards are uneven when N does not divide it"),
    "batch_size": ("batch", "batch_size (none: no automatic batching)"),
    "drop_last": ("drop_last", "drop_last"),
    "prefetch_factor": ("prefetch", "prefetch_factor"),
    "persistent_workers": ("persistent", "persistent_workers"),
    "in_order": ("in_order", "in_order (none: not passed)"),
    "epochs": ("epochs", "epochs iterated over one loader"),
}
#: a point's short key -> its Point field
BY_KEY = {key: name for name, (key, _) in DIMENSIONS.items()}
#: The most workers a point starts: the suite judges a logical bound, not a machine's size.
MAX_WORKERS = 16


class PointError(ValueError):
    """A point's text that does not parse (the replay option names it)."""


@dataclasses.dataclass(frozen=True, order=True)
class Point:
    """One configuration of the loader's arguments."""

    num_workers: int = 3
    parallelism: int | None = None
    dataset: str = "map"
    length: int | None = 8  # None: a dataset without len()
    batch_size: int | None = 2
    drop_last: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    in_order: bool | None = None
    epochs: int = 1

    def text(self, dims: tuple[str, ...] | None = None) -> str:
        """``N=6,p=3,...``: the dimensions ``dims`` (default: all), parseable by :func:`parse`."""
        parts = []
        for name in dims or DIMENSIONS:
            parts.append(f"{DIMENSIONS[name][0]}={_shown(name, getattr(self, name))}")
        return ",".join(parts)

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of this point, beside num_workers and parallelism."""
        out: dict[str, Any] = {"batch_size": self.batch_size}
        if self.batch_size is not None:
            out["drop_last"] = self.drop_last
        if self.prefetch_factor is not None:
            out["prefetch_factor"] = self.prefetch_factor
        if self.persistent_workers:
            out["persistent_workers"] = True
        if self.in_order is not None:
            out["in_order"] = self.in_order
        return out

    @property
    def uneven(self) -> bool:
        return self.dataset == "iterable" and self.length is not None and self.length % self.num_workers != 0


#: Point field -> its annotation's text (what a value of it may be)
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Point)}


def _shown(name: str, value: Any) -> str:
    """A value as a point's text writes it; one of another type than the field's (a build that
    passes ``p="2"`` or ``p=True`` to test validation) as its repr, so it never reads as valid."""
    kind = _FIELD_TYPES[name]
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(int(value)) if "bool" in kind else repr(value)
    if (isinstance(value, int) and "int" in kind) or (isinstance(value, str) and name == "dataset"):
        return str(value)
    return repr(value)


def parse(text: str, *, judgeable: bool = True) -> Point:
    """The point ``text`` (as :meth:`Point.text` writes it) describes; unnamed fields keep their defaults.
    ``judgeable``: refuse what no check can be asked to judge (N outside 1..16, p < 1); a build's
    recorded point may be anything the check passed (``N=0``, the test process's own iteration)."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        name = BY_KEY.get(key.strip())
        if not sep or name is None:
            raise PointError(f"{part!r}: expected KEY=VALUE with KEY one of {', '.join(BY_KEY)}")
        raw = raw.strip().lower()
        field_type = _FIELD_TYPES[name]
        try:
            if raw == "none" and "None" in str(field_type):
                values[name] = None
            elif name == "dataset":
                if raw not in ("map", "iterable"):
                    raise ValueError
                values[name] = raw
            elif "bool" in str(field_type):
                values[name] = {"1": True, "0": False, "true": True, "false": False}[raw]
            else:
                values[name] = int(raw)
        except (KeyError, ValueError):
            raise PointError(f"{part!r}: {raw!r} is not a value of {key}") from None
    point = Point(**values)
    if not judgeable:
        return point
    if not 1 <= point.num_workers <= MAX_WORKERS:
        raise PointError(f"N={point.num_workers}: expected 1..{MAX_WORKERS}")
    if point.parallelism is not None and point.parallelism < 1:
        raise PointError(f"p={point.parallelism}: expected >= 1 or none")
    return point


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


@dataclasses.dataclass(frozen=True)
class Space:
    check_id: str
    dims: tuple[str, ...]
    corners: tuple[Corner, ...]
    #: Limits -> a hypothesis strategy of Points (None: fixed corners only)
    strategy: Callable[[Limits], Any] | None = None

    def corner(self, corner_id: str) -> Corner:
        return next(c for c in self.corners if c.id == corner_id)


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


# --- data served exactly once ------------------------------------------------------------


def _data_points(limits: Limits):
    from hypothesis import strategies as st

    @st.composite
    def draw(d):
        n = d(st.integers(1, limits.max_workers))
        p = d(st.integers(1, min(n + 1, limits.usable_cores + 2))) if limits.parallel else None
        length = d(st.integers(1, 40))
        batch = d(st.one_of(st.none(), st.integers(1, 5)))
        drop_last = d(st.booleans()) if batch is not None else False
        prefetch = d(st.one_of(st.none(), st.integers(1, 4)))
        persistent = d(st.booleans()) if limits.persistent else False
        in_order = d(st.sampled_from((None, True, False))) if limits.in_order_kwarg else None
        epochs = d(st.integers(1, 3))
        return Point(num_workers=n, parallelism=p, dataset="iterable", length=length, batch_size=batch,
                     drop_last=drop_last, prefetch_factor=prefetch, persistent_workers=persistent,
                     in_order=in_order, epochs=epochs)

    return draw()


SPACES: dict[str, Space] = {s.check_id: s for s in (
    Space("start.respects_bound", ("num_workers", "parallelism"), (
        Corner("p1", Point(3, 1)), Corner("p2", Point(3, 2)), Corner("p3", Point(3, 3)),
        Corner("wide", derive=_wide, quick_contexts=("forkserver",),
               why="N >= 2p and p > usable cores: an unbounded start and a bound of p differ"),
    ), _bound_points),
    Space("sharding.exactly_once",
          ("num_workers", "parallelism", "dataset", "length", "batch_size", "drop_last", "prefetch_factor",
           "persistent_workers", "in_order", "epochs"), (
        Corner("even", Point(3, None, "iterable", 30, None), collected=False,
               why="even shards, unbatched: the clause's first case"),
        Corner("uneven", Point(3, 3, "iterable", 31, 2, persistent_workers=True, epochs=2),
               profiles=("full",), why="uneven shards, two epochs of persistent workers"),
    ), _data_points),
)}


def get(check_id: str) -> Space | None:
    return SPACES.get(check_id)
