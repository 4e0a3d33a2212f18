"""The speed clause's decisions on recorded and synthetic series, without a measurement.

``tests/data/speed/*.json`` are the series the suite measured for the reference
and for every speed broken loader, with the outcome it gave then
(``python -m tools.record_speed_series NAME=SPEC`` records one). Each must get the
outcome its loader declares, and the one the suite gave when it was measured;
tests/test_speed_checks.py measures end to end.
"""

import json
from pathlib import Path

import pytest

from pytest_workerstart.conformance.speed.judges import memory_problems, startup_problems, steady_problems, undecided
from pytest_workerstart.fixtures.broken import catalog

_, SPEED_CATCHES = catalog.load()
DATA = Path(__file__).parent / "data" / "speed"
N = 4
CORES = 2
JUDGES = {
    "speed.startup": lambda m, cores=CORES: startup_problems(m, num_workers=N, cores=cores),
    "speed.steady_state": lambda m, cores=CORES: steady_problems(m, num_workers=N),
    "speed.memory": lambda m, cores=CORES: memory_problems(m, num_workers=N),
}


def _recorded(name: str) -> dict:
    """One recorded measurement as the judges take it ({"w1"|"p1"|"pN": {metric: [...]}})."""
    data = json.loads((DATA / f"{name}.json").read_text())
    m: dict = {"w1": {}, "p1": {}, "pN": {}}
    for series in data["measurements"].values():
        for metric, per_config in series.items():
            for config, values in per_config.items():
                m["pN" if config == f"p{N}" else config][metric] = values
    return {**data, "m": m}


@pytest.mark.parametrize("name", sorted(SPEED_CATCHES))
def test_recorded_broken_loader_fails_its_target_and_nothing_unrelated(name):
    catch = SPEED_CATCHES[name]
    rec = _recorded(name)
    assert rec["loader"] == catch.spec, "recorded for another loader"
    for check_id, judge in JUDGES.items():
        problems = judge(rec["m"], rec["usable_cores"])
        assert bool(problems) == (rec["outcomes"][check_id] == "failed"), (name, check_id, problems)
        if check_id in catch.targets:
            assert problems, f"{name}: {check_id} passes on its recorded series"
        elif check_id not in catch.related:
            assert not problems, f"{name}: unrelated {check_id} fails: {problems}"


def test_recorded_reference_passes_every_speed_judge():
    rec = _recorded("reference")
    assert set(rec["outcomes"].values()) == {"passed"}
    for check_id, judge in JUDGES.items():
        assert judge(rec["m"], rec["usable_cores"]) == [], check_id


def test_every_speed_broken_loader_has_a_recorded_series():
    assert {p.stem for p in DATA.glob("*.json")} == {*SPEED_CATCHES, "reference"}


# --- synthetic series: the shape of each defect and of noise ---------------------

BOOT, FIXED = 3.0, 2.0  # seconds per worker boot, fixed part of the first batch


def _series(ttfb, all_workers, rate, cpu, pss, peak, spread=0.0):
    """Three trials around each median, spread apart by +-``spread``/2."""
    def three(v):
        return None if v is None else [v * (1 - spread / 2), v, v * (1 + spread / 2)]
    return {"time_to_first_batch_s": three(ttfb), "time_to_all_workers_s": three(all_workers),
            "warm_samples_per_s": three(rate), "warm_cpu_s_per_sample": three(cpu),
            "pss_increase_mb": three(pss), "peak_rss_increase_mb": three(peak), "workers_delivered": [N] * 3}


def _measurement(**pn) -> dict:
    """A serial start (p1) and a p=N that boots on 2 cores, with ``pn`` overriding p=N's medians."""
    serial = FIXED + N * BOOT
    parallel = FIXED + N * BOOT / CORES
    p1 = dict(ttfb=serial, all_workers=serial + 0.5, rate=800.0, cpu=0.0025, pss=900.0, peak=3200.0)
    spread = pn.pop("spread", 0.0)
    pN = {**p1, "ttfb": parallel, "all_workers": parallel + 0.5, **pn}
    return {"w1": _series(FIXED + BOOT, None, None, None, None, None), "p1": _series(**p1, spread=spread),
            "pN": _series(**pN, spread=spread)}


def test_a_true_parallel_start_passes_every_judge():
    m = _measurement()
    assert [judge(m) for judge in JUDGES.values()] == [[], [], []]


def test_serial_start_behind_a_parallel_api_fails_startup():
    m = _measurement(ttfb=FIXED + N * BOOT, all_workers=FIXED + N * BOOT + 0.5)
    problems = JUDGES["speed.startup"](m)
    assert len(problems) == 2 and "time to first batch" in problems[0] and "derived: boot" in problems[0]


def test_lazy_serial_start_wins_the_first_batch_and_fails_the_last_worker():
    m = _measurement(ttfb=FIXED + BOOT, all_workers=FIXED + N * BOOT + 0.5)
    (problem,) = JUDGES["speed.startup"](m)
    assert problem.startswith("time until every worker has delivered a batch")


def test_a_worker_that_never_delivered_is_named():
    m = _measurement()
    m["pN"]["time_to_all_workers_s"][1] = None
    (problem,) = JUDGES["speed.startup"](m)
    assert "not every worker delivered" in problem


def test_an_explicit_minimum_speedup_replaces_the_derived_one():
    m = _measurement()
    assert startup_problems(m, num_workers=N, cores=CORES) == []
    (problem, _) = startup_problems(m, num_workers=N, cores=CORES, min_speedup=10.0)
    assert "--workerstart-min-speedup" in problem


def test_more_cores_ask_for_more_speedup():
    """The same series pass on 2 cores and fail where 16 cores should have booted all four at once."""
    m = _measurement()
    assert startup_problems(m, num_workers=N, cores=2) == []
    assert startup_problems(m, num_workers=N, cores=16)


def test_a_steady_state_tax_fails_on_rate_and_cpu():
    m = _measurement(rate=480.0, cpu=0.005)
    problems = JUDGES["speed.steady_state"](m)
    assert len(problems) == 2 and "samples/s" in problems[0] and "CPU seconds per sample" in problems[1]


@pytest.mark.parametrize("spread", [0.0, 0.3, 0.6])
def test_identical_code_passes_however_noisy(spread):
    """A noisy run widens the band (up to its cap); the same medians never fail."""
    m = _measurement(spread=spread)
    assert JUDGES["speed.steady_state"](m) == []


def test_noise_never_hides_half_the_throughput():
    m = _measurement(rate=400.0, spread=0.8)
    assert JUDGES["speed.steady_state"](m)


def test_drift_that_slows_both_members_of_a_pair_is_cancelled():
    """p=N's median is half p=1's because three of its trials met a slow minute that hit
    two of p=1's too (a pair runs back to back): pair by pair it kept pace."""
    m = _measurement()
    m["p1"]["warm_samples_per_s"] = [800.0, 805.0, 810.0, 420.0, 425.0]
    m["pN"]["warm_samples_per_s"] = [796.0, 801.0, 418.0, 420.0, 421.0]
    assert steady_problems(m, num_workers=N) == []
    m["pN"]["warm_samples_per_s"] = [400.0, 402.0, 418.0, 210.0, 212.0]  # and half the pace: caught
    assert steady_problems(m, num_workers=N)


def test_a_memory_peak_or_a_kept_increase_fails_memory():
    assert len(JUDGES["speed.memory"](_measurement(peak=3200.0 * 1.5))) == 1
    assert len(JUDGES["speed.memory"](_measurement(pss=900.0 * 1.3))) == 1
    assert JUDGES["speed.memory"](_measurement(pss=900.0 * 1.05, peak=3200.0 * 1.05)) == []


# --- the stopping rule: a third round only where it could change a decision ----------------------

def _first(m: dict, k: int) -> dict:
    return {c: {metric: None if v is None else v[:k] for metric, v in series.items()} for c, series in m.items()}


@pytest.mark.parametrize("name", sorted([*SPEED_CATCHES, "reference"]))
def test_a_decision_settled_after_two_trials_is_the_one_three_gave(name):
    rec = _recorded(name)
    judges = {i: (lambda m, j=j: j(m, rec["usable_cores"])) for i, j in JUDGES.items()}
    two = _first(rec["m"], 2)
    for check_id in set(judges) - set(undecided(two, judges)):
        assert bool(judges[check_id](two)) == (rec["outcomes"][check_id] == "failed"), (name, check_id)


def test_the_rule_stops_far_from_every_bound_and_not_near_one():
    settled = _first(_measurement(), 2)  # a true parallel start, trials that agree
    assert undecided(settled, JUDGES) == []
    serial = _first(_measurement(ttfb=FIXED + N * BOOT, all_workers=FIXED + N * BOOT + 0.5), 2)
    assert undecided(serial, JUDGES) == []  # a clear failure needs no third trial either
    # p=N's two trials straddle the startup bound: a third decides
    m = _measurement()
    m["pN"]["time_to_first_batch_s"] = [FIXED + BOOT, FIXED + N * BOOT]
    assert "speed.startup" in undecided(_first(m, 2), JUDGES)


def test_trials_stop_after_the_rounds_the_rule_asks_for(monkeypatch):
    from pytest_workerstart.harness import trials
    from pytest_workerstart.harness.runner import ScenarioResult

    ran = []

    def fake(target, kwargs, **_):
        ran.append(kwargs["name"])
        return ScenarioResult(status="ok", value={"time_to_first_batch_s": 1.0})

    monkeypatch.setattr(trials, "run_scenario", fake)
    configs = {n: {"name": n} for n in ("w1", "p1", "pN")}
    trials.run_trials(configs, 3, wanted=lambda raw: (), min_trials=2)
    assert ran == ["w1", "p1", "pN", "pN", "p1", "w1"]
    ran.clear()
    trials.run_trials(configs, 3, wanted=lambda raw: configs, min_trials=2)
    assert len(ran) == 9
    ran.clear()
    # a third round of what an undecided id reads, in that round's alternated order
    trials.run_trials(configs, 3, wanted=lambda raw: {"p1", "pN"}, min_trials=2)
    assert ran == ["w1", "p1", "pN", "pN", "p1", "w1", "p1", "pN"]
