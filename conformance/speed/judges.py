"""The speed clause's decisions, as functions of the measured series.

``m`` is one measurement: ``{"w1": series, "p1": series, "pN": series}``, each
series ``{metric: [one value per trial]}`` (``None`` for a trial that gave no
value), as :func:`pytest_workerstart.harness.trials.run_trials` records them and
the verdict's ``measurements`` keep them. Each function returns the failure
texts (empty: the clause holds). Nothing here measures, so the decisions are
tested on recorded and synthetic series (``tests/test_speed_judges.py``)
without booting a worker.
"""

from __future__ import annotations

import statistics
from typing import Any

from pytest_workerstart.probes.timing import derived_startup_threshold, paired_ratio, summarize

Series = dict[str, list[Any]]
Measurement = dict[str, Series]

# Steady state, judged twice over the same warm window. Wall clock: samples/s
# with p=N may fall short of p=1's by the noise measured in this run (the larger
# relative p10-p90 spread of the two configurations), clamped: below, so that
# identical code never flakes; above, so that a loader that loses half its
# parallelism fails however noisy the trials (a bursty neighbour the busy guard
# lets through spread p=1's trials by 30 %). CPU: the process tree's CPU seconds
# per sample may exceed p=1's by its own clamped spread: what catches work added
# to every item. Capped at 0.25 too: identical code (serial start on both sides)
# has measured 1.19x, paired 1.15x, with a CPU spread of 0.39; doubling an item's
# CPU measured 1.37-1.51x.
STEADY_BAND = (0.06, 0.25)
STEADY_CPU_BAND = (0.06, 0.25)
#: p=N's process-tree memory (PSS after the start, peak during it) may exceed p=1's by this factor.
MEMORY_MAX = 1.10
STARTUP_METRICS = (("time_to_first_batch_s", "time to first batch"),
                   ("time_to_all_workers_s", "time until every worker has delivered a batch"))


def _median(values) -> float:
    return statistics.median(v for v in values if v is not None)


def startup_problems(m: Measurement, *, num_workers: int, cores: int, min_speedup: float | None = None,
                     window: int | None = None) -> list[str]:
    """Both the first batch and the moment every worker has delivered must come
    sooner with p=N than with p=1, by a threshold derived from the boot cost in
    ``m`` and ``cores`` (or ``min_speedup`` when given)."""
    problems = []
    w1 = _median(m["w1"]["time_to_first_batch_s"])
    for metric, what in STARTUP_METRICS:
        serial, parallel = m["p1"][metric], m["pN"][metric]
        if any(v is None for v in parallel):
            within = f" within {window} batches" if window else ""
            problems.append(f"{what}: with p={num_workers} not every worker delivered a batch{within} "
                            f"(workers seen per trial: {m['pN'].get('workers_delivered')})")
            continue
        derived = derived_startup_threshold(w1, _median(serial), num_workers, cores)
        threshold = min_speedup or derived["threshold"]
        cmp = paired_ratio(serial, parallel)
        speedup, paired = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
        if speedup >= threshold:
            continue
        source = "--workerstart-min-speedup" if min_speedup else (
            f"derived: boot {derived['boot_s']:.2f} s/worker, fixed {derived['fixed_s']:.2f} s, "
            f"{derived['cores']} usable cores, ideal {derived['ideal_speedup']:.2f}x, half the gain")
        problems.append(
            f"{what} with p={num_workers} is only {speedup:.2f}x faster than p=1 (paired median {paired:.2f}x), "
            f"below {threshold:.2f}x ({source}); medians p=1 {_median(serial):.2f} s, p={num_workers} "
            f"{_median(parallel):.2f} s, 1 worker's first batch {w1:.2f} s; {len(parallel)} trials each")
    return problems


def _steady_problem(a, b, band_range, higher_is_better: bool, what: str, num_workers: int) -> str | None:
    """p=N's trials ``b`` against p=1's ``a``; the failure text, or None.

    Fails only when both the ratio of medians and the median of the alternated
    pairs' ratios (which cancels drift that slows both members of a pair: on a
    VM a slow minute inflates CPU time as much as wall time) are outside the band."""
    cmp = paired_ratio(b, a)
    ratio, paired = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
    sa, sb = summarize(a), summarize(b)
    spread = max((s["p90"] - s["p10"]) / s["median"] for s in (sa, sb))
    band = min(max(spread, band_range[0]), band_range[1])

    def inside(r):
        return r >= 1 - band if higher_is_better else r <= 1 + band

    if inside(ratio) or inside(paired):
        return None
    bound = f"below 1 - {band:.3f}" if higher_is_better else f"above 1 + {band:.3f}"
    return (f"steady-state {what} with p={num_workers} is {ratio:.3f}x that of p=1 (paired median {paired:.3f}x), "
            f"{bound} (noise band: trial spread {spread:.3f} in this run, clamped to {band_range}): "
            f"p=1 {sa}, p={num_workers} {sb}")


def steady_problems(m: Measurement, *, num_workers: int) -> list[str]:
    """Over the warm window, p=N must keep p=1's samples/s and CPU per sample."""
    found = (
        _steady_problem(m["p1"]["warm_samples_per_s"], m["pN"]["warm_samples_per_s"], STEADY_BAND, True,
                        "samples/s", num_workers),
        _steady_problem(m["p1"]["warm_cpu_s_per_sample"], m["pN"]["warm_cpu_s_per_sample"], STEADY_CPU_BAND,
                        False, "CPU seconds per sample (driver and workers)", num_workers))
    return [p for p in found if p]


def memory_problems(m: Measurement, *, num_workers: int) -> list[str]:
    """The process tree's PSS increase after the start and its peak during it, p=N against p=1."""
    problems = []
    for metric, what in (("pss_increase_mb", "PSS increase after the start"),
                         ("peak_rss_increase_mb", "peak resident memory increase during the start")):
        a, b = m["p1"][metric], m["pN"][metric]
        ratio = paired_ratio(b, a)["ratio_of_medians"]
        if ratio > MEMORY_MAX:
            problems.append(f"process-tree {what} with p={num_workers} is {ratio:.3f}x that of p=1 "
                            f"(> {MEMORY_MAX}): p=1 {_median(a):.0f} MiB, p={num_workers} {_median(b):.0f} MiB")
    return problems


# --- when a third trial can change nothing --------------------------------------------------------

#: what each judge reads: {configuration: metrics}
READS: dict[str, dict[str, tuple[str, ...]]] = {
    "speed.startup": {"w1": ("time_to_first_batch_s",), "p1": tuple(m for m, _ in STARTUP_METRICS),
                      "pN": tuple(m for m, _ in STARTUP_METRICS)},
    "speed.steady_state": {c: ("warm_samples_per_s", "warm_cpu_s_per_sample") for c in ("p1", "pN")},
    "speed.memory": {c: ("pss_increase_mb", "peak_rss_increase_mb") for c in ("p1", "pN")},
}


def _next_values(values: list[Any]) -> list[Any]:
    """What one more trial could give, as far as medians, pairs and spreads can tell: either
    extreme of the trials so far, their midpoint, and an outlier beyond either (which moves the
    median to that extreme and widens the noise band to its cap)."""
    known = [v for v in values if v is not None]
    if not known:
        return [None]
    lo, hi = min(known), max(known)
    return [lo, (lo + hi) / 2, hi, lo / 4 if lo > 0 else lo - 4 * (hi - lo + 1), hi * 4 if hi > 0 else hi + 4]


def _completions(m: Measurement, reads: dict[str, tuple[str, ...]]):
    import itertools

    slots = [(c, metric) for c, metrics in reads.items() for metric in metrics]
    for choice in itertools.product(*(_next_values(m[c][metric]) for c, metric in slots)):
        out = {c: dict(series) for c, series in m.items()}
        for (c, metric), value in zip(slots, choice, strict=True):
            out[c][metric] = [*m[c][metric], value]
        yield out


def undecided(m: Measurement, judges: dict[str, Any]) -> list[str]:
    """The ids whose decision one more trial of each configuration could change.

    ``judges``: id -> a function of a measurement returning its problems (what the checks
    call). A decision stands when the judge gives it on ``m`` and on every completion of
    ``m`` by a third trial whose values are any of :func:`_next_values` (chosen metric by
    metric). Each judge compares medians, medians of alternated pairs and the spread of the
    trials: the median of three lies between the two values already measured, and the
    outliers widen a spread as far as its clamp, so these completions show whether a third
    trial could change the outcome; on every recorded series, a decision they call settled
    after two trials is the one three gave (tests/test_speed_judges.py)."""
    out = []
    for check_id, judge in judges.items():
        failed = bool(judge(m))
        if any(bool(judge(c)) != failed for c in _completions(m, READS[check_id])):
            out.append(check_id)
    return out
