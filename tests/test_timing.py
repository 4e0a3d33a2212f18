"""Startup timer: alternation, statistics, and a real speedup measured side by side."""

import pytest

from pytest_workerstart.probes.timing import alternated, assert_startup_speedup, summarize

BIG = "pytest_workerstart.fixtures.datasets:BigPickleDataset"


def test_alternation_is_pairwise():
    assert alternated(["p1", "pN"], 3) == ["p1", "pN", "pN", "p1", "p1", "pN"]


def test_summary_statistics():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median"] == 3.0 and s["n"] == 5 and s["p10"] < s["median"] < s["p90"]


@pytest.mark.timeout(900)
def test_parallel_spawn_start_beats_serial_and_fake_parallel_does_not():
    """Spawn, 4 workers, a 256 KiB dataset pickle: serial start blocks per worker.

    On 2 cores 4 concurrent boots share the CPU, so the bar is modest (1.3x);
    the loader that only *says* it is parallel stays near 1x and must fail it.
    """
    kw = dict(dataset=BIG, num_workers=4, parallelism=4, context="spawn", trials=2,
              loader_kwargs={"batch_size": 2})
    good = assert_startup_speedup({"spec": "reference"}, threshold=1.3, **kw)
    assert good["ratio_of_medians"] >= 1.3
    with pytest.raises(AssertionError, match="below 1.30x"):
        assert_startup_speedup({"spec": "pytest_workerstart.fixtures.broken.loaders:FakeParallel"},
                               threshold=1.3, **kw)
