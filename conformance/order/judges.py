"""The order clause's judges of the streams :mod:`pytest_workerstart.conformance.order.streams` observes.

Pure functions of the streams (and of torch's streams for the same arguments, when the
check has them): each returns the failure texts, empty when the clause holds, so they are
unit-tested on synthetic streams (``tests/test_epochs.py``).
"""

from __future__ import annotations

import dataclasses
import itertools

from pytest_workerstart.conformance.order.streams import FIELDS, GENERATORS, LENGTH, Row, Run, Stream


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
