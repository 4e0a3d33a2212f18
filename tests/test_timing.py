"""Startup timer: alternation, statistics and the derived startup threshold."""

import pytest

from pytest_workerstart.probes.timing import alternated, derived_startup_threshold, paired_ratio, summarize


def test_alternation_is_pairwise():
    assert alternated(["p1", "pN"], 3) == ["p1", "pN", "pN", "p1", "p1", "pN"]


def test_summary_statistics():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median"] == 3.0 and s["n"] == 5 and s["p10"] < s["median"] < s["p90"]


def test_paired_ratio_drops_failed_trials_from_median_and_pair():
    # pair 2 failed on the denominator side: it leaves the pair ratios, not the numerator's median
    r = paired_ratio([2.0, 4.0, 9.0], [1.0, 4.0, None])
    assert r["ratio_of_medians"] == 4.0 / 2.5
    assert r["median_pair_ratio"] == 1.5  # median of 2.0 and 1.0
    assert paired_ratio([1.0], [None]) == {"ratio_of_medians": None, "median_pair_ratio": None}


def test_paired_ratio_pairs_resist_one_sided_stalls():
    # steady 2x with a stall hitting one side of two different pairs: the pairs still say 2x
    r = paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 4.0])
    assert r["median_pair_ratio"] == 2.0 and r["ratio_of_medians"] == 2.0
    r = paired_ratio([2.0, 4.0, 40.0], [1.0, 20.0, 4.0])
    assert r["median_pair_ratio"] == 2.0 and r["ratio_of_medians"] == 1.0


@pytest.mark.parametrize(("cores", "workers", "low", "high"), [
    (2, 4, 1.3, 1.5),    # this machine: never asks for more than 2 cores can give
    (88, 8, 3.8, 4.6),   # the seed's host: 1.1x must not pass
    (1, 4, 1.0, 1.0),    # one core: no gain to ask for
])
def test_derived_threshold_scales_with_usable_cores(cores, workers, low, high):
    # one worker 3 s (0.3 s fixed + 2.7 s boot), serial N workers = 0.3 + N * 2.7
    d = derived_startup_threshold(3.0, 0.3 + workers * 2.7, workers, cores)
    assert abs(d["boot_s"] - 2.7) < 1e-9 and abs(d["fixed_s"] - 0.3) < 1e-9
    assert low <= d["threshold"] <= high, d
    assert d["threshold"] <= d["ideal_speedup"]
