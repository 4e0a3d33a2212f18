"""Speed clause: parallel start must pay off, and cost nothing afterwards.

One measurement serves the three checks (per loader and context): the
benchmark's trial (:func:`pytest_workerstart.probes.timing.trial`) on a reduced
EuroSAT-like set (2,000 JPEGs, a ~100 KB dataset pickle, so serial spawn start
blocks per worker), batch 32, one epoch (63 batches), each trial a fresh driver process
(forked from the zygote: its own import of torch is in no measured span), alternated
round by round:

* ``w1``: 1 worker (the boot-cost reference; first batch only),
* ``p1``: N workers, serial start,
* ``pN``: N workers, parallelism N.

Each item carries the pid of the worker that computed it
(:class:`~pytest_workerstart.probes.timing.WorkerTagged`), so the time until
every worker has delivered a batch is measured from the test's side.

Two rounds, and up to three more, each only where it could change a decision
(:func:`~pytest_workerstart.conformance.speed.judges.undecided`), of the configurations the undecided
ids read: a loader far from every bound is judged in two, with the decision three would
give; a run whose trials a slow minute spread is judged on the median of up to five. All
comparisons are ratios of medians measured side by side in this run; the startup threshold
is derived from the measured boot cost and the usable cores
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

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.conformance.speed.judges import (
    READS,
    memory_problems,
    startup_problems,
    steady_problems,
    undecided,
)
from pytest_workerstart.cores import usable_cores
from pytest_workerstart.harness.trials import run_trials
from pytest_workerstart.probes import foreign_cpu
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
#: The check that makes the measurement waits for up to MAX_TRIALS rounds of three fresh-process
#: trials (each bounded by run_trials' own timeout): beyond the suite's 300 s per check.
measuring = pytest.mark.timeout(1800)
N = 4
#: rounds of trials (w1, p1, pN each once): at least, and at most. Five, not three: the
#: reference's steady state has failed on three trials that one slow minute had spread, where the
#: median of five pairs outvotes two slow ones.
MIN_TRIALS, MAX_TRIALS = 2, 5
PER_CLASS = 200  # 2,000 images
# A cap; the epoch ends first (63 batches). Warm: batches 2N+1.. (every worker has delivered twice).
STEADY_BATCHES = 120
_CACHE: dict[tuple, dict] = {}


def _judges(check_env) -> dict:
    """Each speed id's decision on a measurement: what its check asserts, and what the stopping rule asks."""
    return {
        "speed.startup": lambda m: startup_problems(m, num_workers=N, cores=usable_cores(),
                                                    min_speedup=check_env.settings.min_speedup,
                                                    window=STEADY_BATCHES),
        "speed.steady_state": lambda m: steady_problems(m, num_workers=N),
        "speed.memory": lambda m: memory_problems(m, num_workers=N),
    }


def _wanted(m: dict, judges: dict) -> set[str]:
    """The configurations a third round runs: those read by an id whose decision it could change."""
    return {config for check_id in undecided(m, judges) for config in READS[check_id]}


def _series(raw: dict) -> dict:
    """run_trials' per-trial records as the judges take them: {config: {metric: [per trial]}}."""
    return {name: {m: [t[m] for t in trials] for m in trials[0]} for name, trials in raw.items()}


def _measure(check_env) -> dict:
    if check_env.settings.profile == "quick":
        pytest.skip("quick profile: speed checks run in the full profile")
    key = (check_env.loader.spec, check_env.context_name)
    if key not in _CACHE:
        # torchvision (the trials' image decoding): imported when a speed check runs, not at collection
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
                judges = _judges(check_env)
                with foreign_cpu.ForeignCPU() as during:
                    raw = run_trials(configs, MAX_TRIALS, timeout=300, env=scenarios.child_env(), warm=True,
                                     wanted=lambda raw: _wanted(_series(raw), judges), min_trials=MIN_TRIALS)
            except RuntimeError as exc:
                _CACHE[key] = {"error": str(exc)}
            else:
                _CACHE[key] = _series(raw)
                if during.busy:
                    _CACHE[key] = {"busy": f"the machine was busy during the measurement: {during.describe()}"}
    got = _CACHE[key]
    if "busy" in got:
        pytest.skip(f"speed not judged: {got['busy']}; speed checks need the machine to themselves")
    if "error" in got:
        pytest.fail(f"the speed measurement failed: {got['error'][:2000]}", pytrace=False)
    return got


@check("speed.startup", "parallel start pays off in time to first batch", contexts=("spawn",),
       quick_contexts=("spawn",), serial_only=True, requires=("parallel_start",))
@measuring
def test_startup(check_env):
    """with p=N, both the median time to first batch and the median time until every worker has delivered a batch
    beat p=1 by at least the threshold below (each with its own threshold from the same model; a loader that
    returns from `iter()` at once and boots its workers one by one wins the first, not the second)

    Observed by: ratio of medians (the median of pair ratios is reported)

    Both the first batch and the moment every worker has delivered must come
    sooner: a loader that returns from iter() at once and boots its workers one
    by one in the background wins the first but not the second.
    """
    m = _measure(check_env)
    record_measurements(check_env.request.node, **{
        metric: {"w1": m["w1"][metric], "p1": m["p1"][metric], f"p{N}": m["pN"][metric]}
        for metric in ("time_to_first_batch_s", "time_to_all_workers_s")})
    problems = _judges(check_env)["speed.startup"](m)
    assert not problems, "\n".join(problems)


@check("speed.steady_state", "parallel start costs no steady-state throughput", contexts=("spawn",),
       quick_contexts=("spawn",), serial_only=True, requires=("parallel_start",))
@measuring
def test_steady_state(check_env):
    """over the warm window (batches 2N+1..63, the end of the epoch, after every worker has delivered twice: a
    loader that defers starts boots workers during the first batches, which serial start did before its first
    batch), two quantities of p=N against p=1: samples/s ≥ (1 − band) × p=1's, band = the noise measured in this
    run (the larger relative p10–p90 spread of the two configurations' trials) clamped to [0.06, 0.25], so
    identical code never flakes and a loader that loses half its parallelism fails however noisy the trials; and
    the whole process tree's CPU seconds per sample ≤ (1 + band) × p=1's, band clamped to [0.06, 0.25]
    (identical code measured 1.19× with a 0.39 spread in one CI run; a doubled item CPU 1.37–1.51×), which
    catches work added to every item even where wall clock is too noisy to. Each fails only when both the ratio
    of medians and the median of the alternated pairs' ratios are outside the band (pairs cancel drift: on a VM
    a slow minute inflates CPU time as much as wall time). Both series are in the check's `measurements`

    Observed by: same trials; CPU from `/proc` of the driver and every descendant at batch 2N+1 and after the
    last
    """
    m = _measure(check_env)
    record_measurements(check_env.request.node, **{
        metric: {"p1": m["p1"][metric], f"p{N}": m["pN"][metric]}
        for metric in ("warm_samples_per_s", "warm_cpu_s_per_sample")})
    # Warm window: a loader that defers starts still boots workers during the
    # first batches, which serial start did before its first batch.
    problems = _judges(check_env)["speed.steady_state"](m)
    assert not problems, "\n".join(problems)


@check("speed.memory", "parallel start costs no memory", contexts=("spawn",), quick_contexts=("spawn",),
       serial_only=True, requires=("parallel_start",))
@measuring
def test_memory(check_env):
    """with p=N ≤ 1.10 × p=1 both the process tree's PSS increase after the start and its peak resident memory
    during the start, boots included; a process whose memory cannot be read fails the measurement, it is never
    counted as zero

    Observed by: PSS of every descendant after the first and the last batch, outside the timed loop; the peak as
    the sum over every process of the tree of its own peak resident set (the kernel's exact `VmHWM`), read after
    the first batch, at batch 2N+1 and at the end. PSS has no peak counter, and sampling it walks page tables
    (~50 ms per 800 MB worker here): a sampler thread made the reference miss the startup bar (1.40× against
    1.42×) because the parallel side pays it on a saturated CPU, and it misses short peaks

    Memory of the whole process tree, workers included: its PSS increase after
    the start, and its peak during it (boots included; the sum of every
    process's own peak resident set, the kernel's exact VmHWM).
    """
    m = _measure(check_env)
    record_measurements(check_env.request.node, **{
        metric: {"p1": m["p1"][metric], f"p{N}": m["pN"][metric]}
        for metric in ("pss_increase_mb", "peak_rss_increase_mb")})
    problems = _judges(check_env)["speed.memory"](m)
    assert not problems, "\n".join(problems)
