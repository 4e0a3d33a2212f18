"""The adapters in docs/recipes/ drive their package's loader through the suite.

Each runs only where its package is installed (the ``third-party`` extra pins them);
it proves the recipe gets past the preflight, that checks pass through it, and that
the verdict names the adapted package and its version, not the adapter module.
"""

import importlib.metadata
import pathlib
import shutil

import pytest

RECIPES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "recipes"

#: recipe module -> (import name, distribution)
CASES = {
    "litdata_adapter": ("litdata", "litdata"),
    "mosaic_streaming_adapter": ("streaming", "mosaicml-streaming"),
}
CHECKS = ("digest.first_batch", "order.registration", "start.default_serial")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("recipe", sorted(CASES))
def test_recipe_runs_the_suite(run_suite, pytester, monkeypatch, recipe):
    package, dist = CASES[recipe]
    # not importorskip: pytester restores sys.modules after each test, and torch (imported by
    # the package) cannot be imported twice in one process
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed (pip install 'pytest-workerstart[third-party]')")
    shutil.copy(RECIPES / f"{recipe}.py", pytester.path)
    monkeypatch.chdir(pytester.path)  # the adapter is found in the current directory, as docs/adapter.md says
    verdict = run_suite(f"--workerstart-loader={recipe}:make", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "-k", " or ".join(CHECKS))
    out = verdict.result.stdout.str()
    for check_id in CHECKS:
        # the corners of the full profile are skipped in the quick one
        assert "passed" in verdict.outcomes(check_id) and set(verdict.outcomes(check_id)) <= {"passed", "skipped"}, (
            f"{check_id}: {verdict.outcomes(check_id)}\n{out[-3000:]}")
    loader = verdict.data["loader"]
    assert loader["package"] == package and loader["version"] == installed, loader
    assert f"{recipe}.make, {package} {loader['version']}" in out
    assert "no parallelism keyword found" not in out  # the recipe declared parallel_start: no hint


#: torch batches each worker's share of an iterable dataset and drops that share's last partial
#: batch: 6 workers x 1 batch of 3 = 18 of 23 items
DROP_LAST_POINT = ("N=6,p=none,data=iterable,len=23,batch=3,drop_last=1,prefetch=none,persistent=0,in_order=none,"
                   "epochs=1")


@pytest.mark.timeout(600)
def test_the_litdata_recipe_drops_each_workers_last_partial_batch(run_suite, pytester, monkeypatch):
    """litdata's loader gives drop_last to its dataset, not to torch's batching: the recipe's
    dataset applies it to each worker's items of an iterable dataset."""
    try:
        importlib.metadata.version("litdata")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("litdata is not installed (pip install 'pytest-workerstart[third-party]')")
    shutil.copy(RECIPES / "litdata_adapter.py", pytester.path)
    monkeypatch.chdir(pytester.path)
    verdict = run_suite("--workerstart-loader=litdata_adapter:make", "--workerstart-context=forkserver",
                        f"--workerstart-replay={DROP_LAST_POINT}", "-k", "test_exactly_once_at and explore")
    assert verdict.outcomes("sharding.exactly_once") == ["passed"], verdict.result.stdout.str()[-3000:]
