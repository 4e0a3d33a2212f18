"""A point: one configuration of the loader's arguments, and its text.

Every keyword of torch's ``DataLoader`` that a check varies is a field (``None`` or torch's
default is a value of each), plus the dataset's own dimensions (its kind, length and sample
structure), how many epochs one loader is iterated, and the start schedule (which worker's
``start()`` finishes first: injected delays, so a failure that depends on it replays). A point
is its text (``N=4,p=3,data=iterable``); :func:`parse` reads it back. Pure data: the plugin
imports this without torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Point field -> (short key in a point's text, what it is)
DIMENSIONS: dict[str, tuple[str, str]] = {
    "num_workers": ("N", "num_workers"),
    "parallelism": ("p", "the parallelism keyword's value (none: not passed)"),
    "dataset": ("data", "map (indexable), getitems (map with `__getitems__`) or iterable (sharded by "
                        "get_worker_info())"),
    "length": ("len", "samples in the dataset; an iterable's shards are uneven when N does not divide it"),
    "batch_size": ("batch", "batch_size (none: no automatic batching)"),
    "drop_last": ("drop_last", "drop_last"),
    "prefetch_factor": ("prefetch", "prefetch_factor"),
    "persistent_workers": ("persistent", "persistent_workers"),
    "in_order": ("in_order", "in_order (none: not passed)"),
    "epochs": ("epochs", "epochs iterated over one loader"),
    "shuffle": ("shuffle", "shuffle (none: not passed)"),
    "sampler": ("sampler", "sampler: none, seq (SequentialSampler), random (RandomSampler with its own "
                           "seeded generator), subset (SubsetRandomSampler of every other index), list (a plain "
                           "list of indices, reversed)"),
    "batch_sampler": ("bsampler", "batch_sampler: a BatchSampler over the point's sampler, batch_size and "
                                  "drop_last passed instead of them"),
    "collate": ("collate", "collate_fn: default (none passed), list (returns the samples as a list), wrap "
                           "(default_collate's batch inside a dict with the sample count)"),
    "pin_memory": ("pin", "pin_memory"),
    "timeout": ("timeout", "timeout in seconds (0: wait forever); never reached by a working loader"),
    "worker_init": ("init", "worker_init_fn: none, or reseed (seeds random and NumPy from torch.initial_seed())"),
    "generator": ("gen", "generator: a torch.Generator seeded with this value, or none (torch's global RNG, "
                         "seeded alike for both loaders)"),
    "sample": ("sample", "the sample's structure (every kind default_collate handles)"),
    "schedule": ("sched", "start schedule: none (the machine's timing) or the order in which workers' "
                          "start() begins, on slots 0.2 s apart from the iterator's first start, e.g. 2-0-1"),
}
#: a point's short key -> its Point field
BY_KEY = {key: name for name, (key, _) in DIMENSIONS.items()}
#: The most workers a point starts: the suite judges a logical bound, not a machine's size.
MAX_WORKERS = 16
#: What each structured sample is, in the order a point's text names them.
SAMPLES = ("tensor", "int", "float", "str", "bytes", "ndarray", "npscalar", "dict", "namedtuple", "tuple", "list",
           "nested")
#: The values of each dimension that is a word.
CHOICES: dict[str, tuple[str, ...]] = {
    "dataset": ("map", "getitems", "iterable"),
    "sampler": ("seq", "random", "subset", "list"),
    "collate": ("default", "list", "wrap"),
    "worker_init": ("reseed",),
    "sample": SAMPLES,
}


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
    shuffle: bool | None = None
    sampler: str | None = None
    batch_sampler: bool = False
    collate: str = "default"
    pin_memory: bool = False
    timeout: int = 0
    worker_init: str | None = None
    generator: int | None = None
    sample: str = "tensor"
    #: worker ids in the order their start() finishes (None: not scheduled)
    schedule: tuple[int, ...] | None = None

    def text(self, dims: tuple[str, ...] | None = None) -> str:
        """``N=6,p=3,...``: the dimensions ``dims`` (default: all), parseable by :func:`parse`;
        a keyword of :data:`SHOWN_WHEN_SET` only where it is not torch's default."""
        parts = []
        for name in dims or DIMENSIONS:
            value = getattr(self, name)
            if name in SHOWN_WHEN_SET and value == DEFAULTS[name]:
                continue
            parts.append(f"{DIMENSIONS[name][0]}={_shown(name, value)}")
        return ",".join(parts)

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of this point that are plain values, beside num_workers and
        parallelism (the objects a point names, such as its sampler, are built by
        :mod:`pytest_workerstart.parity_data`)."""
        out: dict[str, Any] = {"batch_size": self.batch_size}
        if self.batch_size is not None:
            out["drop_last"] = self.drop_last
        if self.prefetch_factor is not None:
            out["prefetch_factor"] = self.prefetch_factor
        if self.persistent_workers:
            out["persistent_workers"] = True
        if self.in_order is not None:
            out["in_order"] = self.in_order
        if self.shuffle is not None:
            out["shuffle"] = self.shuffle
        if self.pin_memory:
            out["pin_memory"] = True
        if self.timeout:
            out["timeout"] = self.timeout
        return out

    @property
    def uneven(self) -> bool:
        return self.dataset == "iterable" and self.length is not None and self.length % self.num_workers != 0


#: Dimensions a point's text names only where they are not torch's default (parse restores it).
SHOWN_WHEN_SET = ("shuffle", "sampler", "batch_sampler", "collate", "pin_memory", "timeout", "worker_init",
                  "generator", "sample", "schedule")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Point)}
#: Point field -> its annotation's text (what a value of it may be)
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Point)}


def _shown(name: str, value: Any) -> str:
    """A value as a point's text writes it; one of another type than the field's (a build that
    passes ``p="2"`` or ``p=True`` to test validation) as its repr, so it never reads as valid."""
    kind = _FIELD_TYPES[name]
    if value is None:
        return "none"
    if name == "schedule" and isinstance(value, tuple):
        return "-".join(map(str, value))
    if isinstance(value, bool):
        return str(int(value)) if "bool" in kind else repr(value)
    if (isinstance(value, int) and "int" in kind) or (isinstance(value, str) and name in CHOICES):
        return str(value)
    return repr(value)


def _value(name: str, raw: str) -> Any:
    """A field's value from its text; ValueError or KeyError where it is none."""
    field_type = _FIELD_TYPES[name]
    if raw == "none" and "None" in field_type:
        return None
    if name in CHOICES:
        if raw not in CHOICES[name]:
            raise ValueError(raw)
        return raw
    if name == "schedule":
        order = tuple(int(w) for w in raw.split("-"))
        if sorted(order) != list(range(len(order))):
            raise ValueError(raw)
        return order
    if "bool" in field_type:
        return {"1": True, "0": False, "true": True, "false": False}[raw]
    return int(raw)


def parse(text: str, *, judgeable: bool = True) -> Point:
    """The point ``text`` (as :meth:`Point.text` writes it) describes; unnamed fields keep their defaults.
    ``judgeable``: refuse what no check can be asked to judge (N outside 1..16, p < 1, a schedule that
    does not order every worker); a build's recorded point may be anything the check passed (``N=0``,
    the test process's own iteration)."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        name = BY_KEY.get(key.strip())
        if not sep or name is None:
            raise PointError(f"{part!r}: expected KEY=VALUE with KEY one of {', '.join(BY_KEY)}")
        raw = raw.strip().lower()
        try:
            values[name] = _value(name, raw)
        except (KeyError, ValueError):
            raise PointError(f"{part!r}: {raw!r} is not a value of {key}") from None
    point = Point(**values)
    if not judgeable:
        return point
    if not 1 <= point.num_workers <= MAX_WORKERS:
        raise PointError(f"N={point.num_workers}: expected 1..{MAX_WORKERS}")
    if point.parallelism is not None and point.parallelism < 1:
        raise PointError(f"p={point.parallelism}: expected >= 1 or none")
    if point.schedule is not None and len(point.schedule) != point.num_workers:
        raise PointError(f"sched={_shown('schedule', point.schedule)}: expected an order of all "
                         f"{point.num_workers} workers")
    return point


def declared(item: str) -> str:
    """A ``differs_from_torch`` entry checked: a dimension's key, or ``KEY=VALUE`` with a value of it."""
    key, sep, raw = item.partition("=")
    name = BY_KEY.get(key.strip())
    if name is None:
        raise PointError(f"{item!r}: expected KEY or KEY=VALUE with KEY one of {', '.join(BY_KEY)}")
    if not sep:
        return key.strip()
    try:
        value = _value(name, raw.strip().lower())
    except (KeyError, ValueError):
        raise PointError(f"{item!r}: {raw.strip()!r} is not a value of {key.strip()}") from None
    return f"{key.strip()}={_shown(name, value)}"


def declared_different(point: Point, items: tuple[str, ...]) -> list[str]:
    """The ``differs_from_torch`` entries ``point`` sets: a bare key where its value is not the
    default, ``KEY=VALUE`` where it has that value."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        name = BY_KEY[key]
        value = getattr(point, name)
        if (value == _value(name, raw)) if sep else (value != DEFAULTS[name]):
            out.append(item)
    return out


def without(point: Point, items: tuple[str, ...]) -> Point:
    """``point`` with every dimension of a declared entry it sets back at its default."""
    hit = declared_different(point, items)
    return dataclasses.replace(point, **{BY_KEY[i.partition("=")[0]]: DEFAULTS[BY_KEY[i.partition("=")[0]]]
                                         for i in hit}) if hit else point
