"""Streams over several epochs: each sample's index, its worker, and what it drew from the
global generators a worker hands to user code (torch, ``random``, NumPy).

A :class:`Run` is one loader configuration iterated for :data:`EPOCHS` epochs (a fresh
iterator per epoch, or its persistent workers reused) over a shuffled map-style
:class:`~pytest_workerstart.datasets.RngDrawDataset` or the worker-sharded,
worker-shuffled :class:`~pytest_workerstart.datasets.ShuffledShards`. A stream is
one list of rows ``(index, worker, torch, random, numpy)`` per epoch. Torch's own streams
for the same arguments come from torch's ``DataLoader`` in a fresh process
(:func:`torch_streams`), never from the loader under test. The judges at the end are pure
functions of the streams (and of torch's streams for the same arguments, when the check has
them): each returns the failure texts, empty when the clause holds, so they are unit-tested on
synthetic streams (``tests/test_epochs.py``).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from pytest_workerstart.datasets import RngDrawDataset, ShuffledShards

EPOCHS = 3
WORKERS = 2
LENGTH = 12
BATCH = 2
SEEDS = (1234, 4321)
GENERATORS = ("torch", "random", "numpy")
FIELDS = ("index", "worker", *GENERATORS)

Row = tuple[int, ...]
Stream = list[list[Row]]


@dataclasses.dataclass(frozen=True)
class Run:
    kind: str  # "map" (shuffled) | "iterable" (sharded by worker)
    persistent: bool
    num_workers: int
    seed: int = SEEDS[0]
    #: the loader's parallelism keyword (None: omitted); torch's truth does not depend on it
    parallelism: int | None = None

    @property
    def truth_key(self) -> tuple:
        return (self.kind, self.persistent, self.num_workers, self.seed)

    def __str__(self) -> str:
        kind = "shuffled map-style" if self.kind == "map" else "sharded iterable"
        parts = [kind, f"num_workers={self.num_workers}"]
        if self.persistent:
            parts.append("persistent_workers")
        if self.parallelism is not None:
            parts.append(f"p={self.parallelism}")
        parts.append(f"generator seed {self.seed}")
        return ", ".join(parts)


def plan(*, parallel: bool, iterable: bool, persistent: bool) -> list[Run]:
    """The runs one context is observed in: num_workers 0 and N, with and without persistent
    workers, p = N where parallel start is declared and its p = 1 twin (persistent workers where
    declared: one start instead of one per epoch), and a second generator seed.

    The sharded iterable runs once with workers, in the last life: a fresh start per epoch
    reseeds every worker the same way for either kind of dataset, which the map-style run
    without persistent workers already observes."""
    ps = [1, WORKERS] if parallel else [None]
    kinds = ["map", "iterable"] if iterable else ["map"]
    lives = [False, True] if persistent else [False]
    runs = [Run(kind, False, 0) for kind in kinds]
    if parallel:
        runs.append(Run("map", lives[-1], WORKERS, parallelism=1))
    runs += [Run("map", life, WORKERS, parallelism=ps[-1]) for life in lives]
    if iterable:
        runs.append(Run("iterable", lives[-1], WORKERS, parallelism=ps[-1]))
    runs.append(Run("map", persistent, WORKERS, SEEDS[1], parallelism=ps[-1]))
    return runs


def dataset(kind: str):
    return RngDrawDataset(LENGTH) if kind == "map" else ShuffledShards(LENGTH)


def loader_kwargs(run: Run) -> dict[str, Any]:
    import torch

    kw: dict[str, Any] = {"batch_size": BATCH, "generator": torch.Generator().manual_seed(run.seed)}
    if run.kind == "map":
        kw["shuffle"] = True
    if run.persistent:
        kw["persistent_workers"] = True
    return kw


def rows_of(batch) -> list[Row]:
    return list(zip(*(batch[f].tolist() for f in FIELDS), strict=True))


def iterate(loader, epochs: int = EPOCHS) -> Stream:
    return [[row for batch in loader for row in rows_of(batch)] for _ in range(epochs)]


def torch_streams(keys: list[list]) -> dict[str, Stream]:
    """Scenario (fresh process): torch's ``DataLoader``'s stream for each ``Run.truth_key``.

    The values do not depend on the start method; fork where there is one, as it boots fastest."""
    import multiprocessing

    from torch.utils.data import DataLoader

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    out = {}
    for key in keys:
        run = Run(*key)
        extra = {"multiprocessing_context": method} if run.num_workers else {}
        loader = DataLoader(dataset(run.kind), num_workers=run.num_workers, **loader_kwargs(run), **extra)
        out[repr(tuple(key))] = iterate(loader)
        del loader
    return out


def decode(truths: dict[str, Stream]) -> dict[tuple, Stream]:
    """:func:`torch_streams`' JSON back to ``truth_key -> stream`` with rows as tuples."""
    import ast

    return {ast.literal_eval(k): [[tuple(r) for r in rows] for rows in v] for k, v in truths.items()}


# --- the judges ------------------------------------------------------------------------------

def _indices(stream: Stream) -> list[list[int]]:
    return [[r[0] for r in rows] for rows in stream]


def _twins(streams: dict[Run, Stream], field: str) -> list[tuple[Run, Run]]:
    """Pairs of runs that differ only in ``field``."""
    out = []
    for a, b in itertools.combinations(streams, 2):
        same = {f.name for f in dataclasses.fields(Run) if getattr(a, f.name) == getattr(b, f.name)}
        if same == {f.name for f in dataclasses.fields(Run)} - {field}:
            out.append((a, b))
    return out


def _first_difference(got: Stream, truth: Stream) -> tuple[int, int] | None:
    for e, (rows, true_rows) in enumerate(zip(got, truth, strict=True)):
        for k in range(max(len(rows), len(true_rows))):
            if k >= len(rows) or k >= len(true_rows) or rows[k] != true_rows[k]:
                return e, k
    return None


def _show(rows: list[Row], k: int, fields: tuple[str, ...]) -> str:
    if k >= len(rows):
        return "nothing (the epoch ended)"
    return ", ".join(f"{f}={rows[k][FIELDS.index(f)]}" for f in fields)


def order_problems(streams: dict[Run, Stream], truths: dict[tuple, Stream] | None) -> list[str]:
    """``order.epoch_shuffle``: each epoch serves every index once; a shuffled loader's epochs are
    different permutations that follow the generator and do not depend on p; with ``truths``
    (torch's streams), every epoch's index stream is torch's."""
    problems = []
    for run, stream in streams.items():
        idx = _indices(stream)
        for e, got in enumerate(idx, 1):
            if sorted(got) != list(range(LENGTH)):
                problems.append(f"{run}: epoch {e} did not serve each of the {LENGTH} indices once: {got}")
        if run.kind == "map":
            for a, b in itertools.combinations(range(len(idx)), 2):
                if idx[a] == idx[b]:
                    problems.append(f"{run}: epochs {a + 1} and {b + 1} repeat the same permutation {idx[a]}")
        if truths is not None:
            truth = _indices(truths[run.truth_key])
            for e, (got, want) in enumerate(zip(idx, truth, strict=True), 1):
                if got != want:
                    problems.append(f"{run}: epoch {e}'s index stream {got} differs from torch's DataLoader's "
                                    f"{want} for the same arguments and generator")
                    break
    for a, b in _twins(streams, "seed"):
        if _indices(streams[a]) == _indices(streams[b]):
            problems.append(f"generator seeds {a.seed} and {b.seed} give the same index streams ({a})")
    for a, b in _twins(streams, "parallelism"):
        if _indices(streams[a]) != _indices(streams[b]):
            problems.append(f"the index stream depends on parallelism: {a} gave {_indices(streams[a])}, "
                            f"p={b.parallelism} gave {_indices(streams[b])}")
    return problems


def first_draws(stream: Stream) -> dict[tuple[int, int], Row]:
    """(epoch, worker) -> the draws of that worker's first sample in that epoch (epochs from 1)."""
    out: dict[tuple[int, int], Row] = {}
    for e, rows in enumerate(stream, 1):
        for r in rows:
            out.setdefault((e, r[1]), r[2:])
    return out


def rng_problems(streams: dict[Run, Stream], truths: dict[tuple, Stream] | None) -> list[str]:
    """``order.rng_streams``: for each global generator, what a worker's user code draws first in an
    epoch differs between workers, between epochs and between generator seeds, and does not
    depend on p; with ``truths``, every draw of every sample is torch's."""
    problems = []
    observed = [g for k, g in enumerate(GENERATORS)
                if any(r[2 + k] != -1 for s in streams.values() for rows in s for r in rows)]
    for run, stream in streams.items():
        if not run.num_workers:
            continue
        first = first_draws(stream)
        for k, gen in enumerate(GENERATORS):
            if gen not in observed:
                continue
            by_value: dict[int, list[tuple[int, int]]] = {}
            for (e, w), draws in sorted(first.items()):
                by_value.setdefault(draws[k], []).append((e, w))
            for value, where in by_value.items():
                if len(where) < 2:
                    continue
                epochs, workers = {e for e, _ in where}, {w for _, w in where}
                what = ("workers " + ", ".join(map(str, sorted(workers))) + f" in epoch {min(epochs)}"
                        if len(epochs) == 1 else
                        f"worker {min(workers)} in epochs " + ", ".join(map(str, sorted(epochs)))
                        if len(workers) == 1 else
                        "(epoch, worker) " + ", ".join(map(str, where)))
                problems.append(f"{run}: {gen}'s first draw repeats: {what} all drew {value}")
                break
        if truths is not None:
            truth = truths[run.truth_key]
            diff = _first_difference(stream, truth)
            if diff is not None:
                e, k = diff
                problems.append(
                    f"{run}: epoch {e + 1}, sample {k + 1}: got {_show(stream[e], k, FIELDS)}; torch's DataLoader "
                    f"gives {_show(truth[e], k, FIELDS)} for the same arguments and generator")
    for a, b in _twins(streams, "seed"):
        fa, fb = first_draws(streams[a]), first_draws(streams[b])
        for k, gen in enumerate(GENERATORS):
            if gen in observed and fa and [d[k] for d in fa.values()] == [d[k] for d in fb.values()]:
                problems.append(f"{gen}: generator seeds {a.seed} and {b.seed} give every worker the same draws ({a})")
    for a, b in _twins(streams, "parallelism"):
        diff = _first_difference(streams[a], streams[b])
        if diff is not None:
            e, k = diff
            problems.append(f"the draws depend on parallelism ({a}): epoch {e + 1}, sample {k + 1}: "
                            f"{_show(streams[a][e], k, FIELDS)} vs {_show(streams[b][e], k, FIELDS)} "
                            f"at p={b.parallelism}")
    return problems
