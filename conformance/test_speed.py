"""Speed clause: parallel start must pay off, and cost nothing afterwards.

One measurement serves the three checks (per loader and context): the
benchmark's trial (:func:`pytest_workerstart.probes.timing.trial`) on a reduced
EuroSAT-like set (2,000 JPEGs, a ~100 KB dataset pickle, so serial spawn start
blocks per worker), batch 32, 120 batches, in fresh interpreters, alternated
pair by pair:

* ``w1``: 1 worker (the boot-cost reference; first batch only),
* ``p1``: N workers, serial start,
* ``pN``: N workers, parallelism N.

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

check = pytest.mark.workerstart_check
N = 4
TRIALS = 3
PER_CLASS = 200  # 2,000 images
STEADY_MIN = 0.95
STEADY_BATCHES = 120  # steady state: batches 2N+1..120 ("warm": every worker has delivered twice)
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
                "loader_kwargs": {"batch_size": 32, "shuffle": True, "prefetch_factor": 2}, "generator_seed": 0}
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


@check("speed.startup")
def test_startup(check_env):
    m = _measure(check_env)
    ttfb = {k: m[k]["time_to_first_batch_s"] for k in ("w1", "p1", "pN")}
    derived = derived_startup_threshold(_median(ttfb["w1"]), _median(ttfb["p1"]), N, usable_cores())
    threshold = check_env.settings.min_speedup or derived["threshold"]
    cmp = paired_ratio(ttfb["p1"], ttfb["pN"])
    speedup, paired = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
    source = "--workerstart-min-speedup" if check_env.settings.min_speedup else (
        f"derived: boot {derived['boot_s']:.2f} s/worker, fixed {derived['fixed_s']:.2f} s, "
        f"{derived['cores']} usable cores, ideal {derived['ideal_speedup']:.2f}x, half the gain")
    assert speedup >= threshold, (
        f"time to first batch with p={N} is only {speedup:.2f}x faster than p=1 (paired median {paired:.2f}x), "
        f"below {threshold:.2f}x ({source}); medians p=1 {_median(ttfb['p1']):.2f} s, p={N} "
        f"{_median(ttfb['pN']):.2f} s, 1 worker {_median(ttfb['w1']):.2f} s; {TRIALS} trials each")


@check("speed.steady_state")
def test_steady_state(check_env):
    m = _measure(check_env)
    # Warm window: a loader that defers starts still boots workers during the
    # first batches, which serial start did before its first batch.
    # One-sided, noise-aware: identical code varies by up to ~8 % between
    # configurations on a 2-core VM (0.944x seen for the reference), so the
    # check fails when even p=N's upper decile is below the bar.
    a, b = m["p1"]["warm_samples_per_s"], m["pN"]["warm_samples_per_s"]
    ratio = paired_ratio(b, a)["ratio_of_medians"]
    upper = summarize(b)["p90"] / _median(a)
    assert upper >= STEADY_MIN, (
        f"steady-state samples/s with p={N} is {ratio:.3f}x that of p=1 (p90 {upper:.3f}x < {STEADY_MIN}): "
        f"p=1 {summarize(a)}, p={N} {summarize(b)}")


@check("speed.memory")
def test_memory(check_env):
    m = _measure(check_env)
    a, b = m["p1"]["pss_increase_mb"], m["pN"]["pss_increase_mb"]
    ratio = paired_ratio(b, a)["ratio_of_medians"]
    assert ratio <= MEMORY_MAX, (
        f"process-tree PSS increase with p={N} is {ratio:.3f}x that of p=1 (> {MEMORY_MAX}): "
        f"p=1 {_median(a):.0f} MiB, p={N} {_median(b):.0f} MiB")

