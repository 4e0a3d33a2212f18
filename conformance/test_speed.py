"""Speed clause: parallel start must pay off, and cost nothing afterwards.

One measurement serves the three checks (per loader and context): the
benchmark's trial (:func:`pytest_workerstart.probes.timing.trial`) on a reduced
EuroSAT-like set (2,000 JPEGs, a ~100 KB dataset pickle, so serial spawn start
blocks per worker), batch 32, one epoch (63 batches), in fresh interpreters, alternated
pair by pair:

* ``w1``: 1 worker (the boot-cost reference; first batch only),
* ``p1``: N workers, serial start,
* ``pN``: N workers, parallelism N.

Each item carries the pid of the worker that computed it
(:class:`~pytest_workerstart.probes.timing.WorkerTagged`), so the time until
every worker has delivered a batch is measured from the test's side.

All comparisons are ratios of medians measured side by side in this run; the
startup threshold is derived from the measured boot cost and the usable cores
(:func:`~pytest_workerstart.probes.timing.derived_startup_threshold`), unless
``--workerstart-min-speedup`` sets it. Spawn only: the clause is about boots
that block ``start()``; forkserver with preload makes them cheap. The checks run
serially (never under xdist) and only in the full profile. On a machine whose
CPUs other processes keep busy (more than a quarter of them, sampled for 2 s
before and accounted over the whole measurement, see
:mod:`pytest_workerstart.probes.foreign_cpu`) the measurement says nothing about
the loader: the checks are skipped with the numbers, never failed or passed.
"""

from __future__ import annotations

import statistics

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.probes import foreign_cpu
from pytest_workerstart.probes.timing import derived_startup_threshold, paired_ratio, run_trials, summarize, usable_cores
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 4
TRIALS = 3
PER_CLASS = 200  # 2,000 images
# Steady state, judged twice over the same warm window. Wall clock: samples/s
# with p=N may fall short of p=1's by the noise measured in this run (the larger
# relative p10-p90 spread of the two configurations), clamped: below, so that
# identical code never flakes; above, so that a loader that loses half its
# parallelism fails however noisy the trials (a bursty neighbour the busy guard
# lets through spread p=1's trials by 30 % in CI). CPU: the process tree's CPU
# seconds per sample may exceed p=1's by its own clamped spread: what catches work
# added to every item. Capped at 0.25 too: session 10's CI measured identical code
# (FakeParallel, serial start on both sides) at 1.19x, paired 1.15x, with a CPU
# spread of 0.39; doubling an item's CPU (SteadyStateTax) measured 1.37-1.51x.
STEADY_BAND = (0.06, 0.25)
STEADY_CPU_BAND = (0.06, 0.25)
STEADY_BATCHES = 120  # a cap; the epoch ends first (63 batches). Warm: batches 2N+1.. (every worker has delivered twice)
MEMORY_MAX = 1.10
_CACHE: dict[tuple, dict] = {}


def _measure(check_env) -> dict:
    if check_env.settings.profile == "quick":
        pytest.skip("quick profile: speed checks run in the full profile")
    key = (check_env.loader.spec, check_env.context_name)
    if key not in _CACHE:
        from pytest_workerstart.bench.eurosat import make_dataset

        root, _ = make_dataset(per_class=PER_CLASS)
        base = {"loader": check_env.loader.payload(), "dataset": "pytest_workerstart.bench.eurosat:EuroSATLike",
                "dataset_kwargs": {"root": str(root)}, "context": check_env.context_name, "max_batches": STEADY_BATCHES,
                "loader_kwargs": {"batch_size": 32, "shuffle": True, "prefetch_factor": 2}, "generator_seed": 0,
                "tag_workers": True}
        configs = {
            "w1": {**base, "loader_kwargs": {**base["loader_kwargs"], "num_workers": 1}, "parallelism": None,
                   "max_batches": 2},
            "p1": {**base, "loader_kwargs": {**base["loader_kwargs"], "num_workers": N}, "parallelism": None},
            "pN": {**base, "loader_kwargs": {**base["loader_kwargs"], "num_workers": N}, "parallelism": N},
        }
        before = foreign_cpu.sample()
        if before.busy:
            _CACHE[key] = {"busy": f"the machine is busy before the measurement: {before.describe()}"}
        else:
            try:
                with foreign_cpu.ForeignCPU() as during:
                    raw = run_trials(configs, TRIALS, timeout=300, env=scenarios.child_env())
            except RuntimeError as exc:
                _CACHE[key] = {"error": str(exc)}
            else:
                _CACHE[key] = {name: {m: [t[m] for t in trials] for m in trials[0]} for name, trials in raw.items()}
                if during.busy:
                    _CACHE[key] = {"busy": f"the machine was busy during the measurement: {during.describe()}"}
    got = _CACHE[key]
    if "busy" in got:
        pytest.skip(f"speed not judged: {got['busy']}; speed checks need the machine to themselves")
    if "error" in got:
        pytest.fail(f"the speed measurement failed: {got['error'][:2000]}", pytrace=False)
    return got


def _median(values) -> float:
    return statistics.median(v for v in values if v is not None)


def _startup_ratio(check_env, m, metric: str, what: str) -> str | None:
    """``what`` with p=N must beat p=1 by the threshold; the failure text, or None."""
    w1 = _median(m["w1"]["time_to_first_batch_s"])
    serial, parallel = m["p1"][metric], m["pN"][metric]
    if any(v is None for v in parallel):
        return (f"{what}: with p={N} not every worker delivered a batch within {STEADY_BATCHES} batches "
                f"(workers seen per trial: {m['pN']['workers_delivered']})")
    derived = derived_startup_threshold(w1, _median(serial), N, usable_cores())
    threshold = check_env.settings.min_speedup or derived["threshold"]
    cmp = paired_ratio(serial, parallel)
    speedup, paired = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
    if speedup >= threshold:
        return None
    source = "--workerstart-min-speedup" if check_env.settings.min_speedup else (
        f"derived: boot {derived['boot_s']:.2f} s/worker, fixed {derived['fixed_s']:.2f} s, "
        f"{derived['cores']} usable cores, ideal {derived['ideal_speedup']:.2f}x, half the gain")
    return (f"{what} with p={N} is only {speedup:.2f}x faster than p=1 (paired median {paired:.2f}x), "
            f"below {threshold:.2f}x ({source}); medians p=1 {_median(serial):.2f} s, p={N} "
            f"{_median(parallel):.2f} s, 1 worker's first batch {w1:.2f} s; {TRIALS} trials each")


@check("speed.startup")
def test_startup(check_env):
    """Both the first batch and the moment every worker has delivered must come
    sooner: a loader that returns from iter() at once and boots its workers one
    by one in the background wins the first but not the second."""
    m = _measure(check_env)
    record_measurements(check_env.request.node, **{
        metric: {"w1": m["w1"][metric], "p1": m["p1"][metric], f"p{N}": m["pN"][metric]}
        for metric in ("time_to_first_batch_s", "time_to_all_workers_s")})
    problems = [p for p in (_startup_ratio(check_env, m, "time_to_first_batch_s", "time to first batch"),
                            _startup_ratio(check_env, m, "time_to_all_workers_s",
                                           "time until every worker has delivered a batch")) if p]
    assert not problems, "\n".join(problems)


def _steady_problem(a, b, band_range, higher_is_better: bool, what: str) -> str | None:
    """p=N's trials ``b`` against p=1's ``a``; the failure text, or None.

    Fails only when both the ratio of medians and the median of the alternated
    pairs' ratios (which cancels drift that slows both members of a pair: on this
    VM a slow minute inflates CPU time as much as wall time) are outside the band."""
    cmp = paired_ratio(b, a)
    ratio, paired = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
    sa, sb = summarize(a), summarize(b)
    spread = max((s["p90"] - s["p10"]) / s["median"] for s in (sa, sb))
    band = min(max(spread, band_range[0]), band_range[1])
    inside = (lambda r: r >= 1 - band) if higher_is_better else (lambda r: r <= 1 + band)
    if inside(ratio) or inside(paired):
        return None
    bound = f"below 1 - {band:.3f}" if higher_is_better else f"above 1 + {band:.3f}"
    return (f"steady-state {what} with p={N} is {ratio:.3f}x that of p=1 (paired median {paired:.3f}x), {bound} "
            f"(noise band: trial spread {spread:.3f} in this run, clamped to {band_range}): p=1 {sa}, p={N} {sb}")


@check("speed.steady_state")
def test_steady_state(check_env):
    m = _measure(check_env)
    record_measurements(check_env.request.node, **{
        metric: {"p1": m["p1"][metric], f"p{N}": m["pN"][metric]}
        for metric in ("warm_samples_per_s", "warm_cpu_s_per_sample")})
    # Warm window: a loader that defers starts still boots workers during the
    # first batches, which serial start did before its first batch.
    problems = [p for p in (
        _steady_problem(m["p1"]["warm_samples_per_s"], m["pN"]["warm_samples_per_s"], STEADY_BAND, True,
                        "samples/s"),
        _steady_problem(m["p1"]["warm_cpu_s_per_sample"], m["pN"]["warm_cpu_s_per_sample"], STEADY_CPU_BAND,
                        False, "CPU seconds per sample (driver and workers)")) if p]
    assert not problems, "\n".join(problems)


@check("speed.memory")
def test_memory(check_env):
    """Memory of the whole process tree, workers included: its PSS increase after
    the start, and its peak during it (boots included; the sum of every
    process's own peak resident set, the kernel's exact VmHWM)."""
    m = _measure(check_env)
    problems = []
    for metric, what in (("pss_increase_mb", "PSS increase after the start"),
                         ("peak_rss_increase_mb", "peak resident memory increase during the start")):
        a, b = m["p1"][metric], m["pN"][metric]
        ratio = paired_ratio(b, a)["ratio_of_medians"]
        if ratio > MEMORY_MAX:
            problems.append(f"process-tree {what} with p={N} is {ratio:.3f}x that of p=1 (> {MEMORY_MAX}): "
                            f"p=1 {_median(a):.0f} MiB, p={N} {_median(b):.0f} MiB")
    assert not problems, "\n".join(problems)
