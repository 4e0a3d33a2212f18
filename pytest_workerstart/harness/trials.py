"""Timing trials: each configuration's trials in fresh scenario processes, alternated
pair by pair (A B, B A, ...) so drift hits both sides equally; what a trial measures is
:func:`pytest_workerstart.probes.timing.trial`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pytest_workerstart.harness.runner import run_scenario
from pytest_workerstart.probes import timing
from pytest_workerstart.probes.timing import alternated, paired_ratio, summarize


def run_trials(configs: dict[str, dict], trials: int, timeout: float = 600.0,
               progress: Callable[[str], None] | None = None, keep_going: bool = False,
               env: dict[str, str] | None = None, warm: bool = False,
               wanted: Callable[[dict[str, list[dict]]], Collection[str]] | None = None,
               min_trials: int | None = None) -> dict[str, list[dict]]:
    """Run ``trial`` for every configuration, alternated, each in a fresh process.

    A failed trial raises, or with ``keep_going`` is recorded as ``{"error": ...}``.
    ``warm``: each trial's driver is forked from the zygote (a fresh process, workers
    and all, without the driver's own import of torch, which no measured span includes).
    ``wanted``: a sequential stopping rule, asked before each round after ``min_trials``
    rounds: the configurations that round must run (the others are left out of it; none
    ends the measurement before ``trials`` rounds).
    A trial's process ends without the interpreter's teardown once its result is written:
    nothing is measured after its loader is gone.
    """
    results: dict[str, list[dict]] = {name: [] for name in configs}
    per_round = len(configs)
    order = alternated(list(configs), trials)
    total = len(order)
    done = 0
    for r in range(trials):
        names = order[per_round * r:per_round * (r + 1)]
        if wanted is not None and r >= (min_trials or trials):
            need = set(wanted(results))
            if not need:
                break
            names = [n for n in names if n in need]
            total -= per_round - len(names)
        for name in names:
            done += 1
            res = run_scenario(f"{timing.__name__}:trial", configs[name], timeout=timeout, env=env,
                               measuring=True, warm=warm)
            if res.status != "ok":
                if not keep_going:
                    raise RuntimeError(f"trial {done} ({name}) failed: {res.details()}")
                results[name].append({"error": res.one_line(), "details": res.details()[-2000:]})
                if progress:
                    progress(f"trial {done}/{total} {name}: FAILED: {res.one_line()}")
                continue
            results[name].append(res.value)
            if progress:
                progress(f"trial {done}/{total} {name}: first batch {res.value['time_to_first_batch_s']:.2f} s")
    return results


def assert_startup_speedup(loader: dict, dataset: str, *, num_workers: int, parallelism: int, threshold: float,
                           context: str = "spawn", trials: int = 3, dataset_kwargs: dict | None = None,
                           loader_kwargs: dict | None = None) -> dict[str, Any]:
    """Assert median TTFB(p=1) / median TTFB(p=parallelism) >= ``threshold``.

    ``loader``: ``{"spec": "module:attr"}`` (plus optional ``kwarg`` and ``caps``).
    Trials alternate p=1 and p=N in fresh processes; the ratio of medians is
    compared, and the median of per-pair ratios is reported alongside.
    """
    base = {"loader": loader, "dataset": dataset, "dataset_kwargs": dataset_kwargs or {},
            "loader_kwargs": {"num_workers": num_workers, **(loader_kwargs or {})}, "context": context,
            "max_batches": 2}
    res = run_trials({"p1": {**base, "parallelism": 1}, "pN": {**base, "parallelism": parallelism}}, trials)
    a = [r["time_to_first_batch_s"] for r in res["p1"]]
    b = [r["time_to_first_batch_s"] for r in res["pN"]]
    out = {"p1": summarize(a), "pN": summarize(b), **paired_ratio(a, b)}
    ratio, paired = out["ratio_of_medians"], out["median_pair_ratio"]
    assert ratio >= threshold, (f"startup speedup {ratio:.2f}x (paired median {paired:.2f}x) is below "
                                f"{threshold:.2f}x: p=1 {out['p1']}, p={parallelism} {out['pN']}")
    return out
