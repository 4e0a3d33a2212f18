"""Streams over several epochs: each sample's index, its worker, and what it drew from the
global generators a worker hands to user code (torch, ``random``, NumPy).

A :class:`Run` is one loader configuration iterated for :data:`EPOCHS` epochs (a fresh
iterator per epoch, or its persistent workers reused) over a shuffled map-style
:class:`~pytest_workerstart.datasets.RngDrawDataset` or the worker-sharded,
worker-shuffled :class:`~pytest_workerstart.datasets.ShuffledShards`. A stream is
one list of rows ``(index, worker, torch, random, numpy)`` per epoch. Torch's own streams
for the same arguments come from torch's ``DataLoader`` in a fresh process
(:func:`torch_streams`), never from the loader under test. The order clause judges the
streams (``conformance/order/judges.py``).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import dataclasses
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
