"""A scenario check that failed is judged again (twice by default): a case that then passes fails
as unstable, one that fails every run fails as before, and a pass is judged once. (The other
self-tests' suite runs judge a failure once: tests/conftest.py.)"""

import pytest

from pytest_workerstart import settings
from tests.test_verdict import FAST, NO_PREFLIGHT

#: a loader that writes to stderr at interpreter exit: on the first build only (a marker file
#: says it happened), or on every build
LOADERS = """
    import atexit
    import os
    import sys

    from torch.utils.data import DataLoader

    class Noisy(DataLoader):
        once = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            mark = os.environ["WS_NOISY_MARK"]
            if not (self.once and os.path.exists(mark)):
                open(mark, "a").close()
                atexit.register(sys.stderr.write, "noisy: said at exit\\n")

    class NoisyOnce(Noisy):
        once = True
"""
ARGS = (*FAST, NO_PREFLIGHT, "--workerstart-profile=quick", "--workerstart-parallelism-kwarg=none",
        "-k", "exit.clean_interpreter")


def test_two_runs_by_default():
    assert settings.BY_FIELD["failure_runs"].default == 2


def _case(verdict) -> dict:
    (case,) = [c for c in verdict.data["checks"] if c["id"] == "exit.clean_interpreter" and c["outcome"] != "skipped"]
    return case


@pytest.mark.parametrize("loader, runs, outcome, reason, judged", [
    ("NoisyOnce", 2, "failed", "unstable: failed 1 of 2: after early break: stderr is not empty",
     ["failed", "passed"]),
    ("Noisy", 3, "failed", "after early break: stderr is not empty", ["failed"] * 3),
    ("Noisy", 1, "failed", "after early break: stderr is not empty", None),
])
def test_a_failed_scenario_is_judged_again(pytester, run_suite, monkeypatch, loader, runs, outcome, reason, judged):
    pytester.makepyfile(noisy=LOADERS)
    monkeypatch.setenv("WS_NOISY_MARK", str(pytester.path / "mark"))
    case = _case(run_suite(*ARGS, f"--workerstart-failure-runs={runs}", f"--workerstart-loader=noisy:{loader}"))
    assert case["outcome"] == outcome, case
    assert case["reason"].removeprefix("Failed: ").removeprefix("AssertionError: ").startswith(reason), case["reason"]
    assert (case["measurements"] or {}).get("runs") == judged, case["measurements"]


def test_a_pass_is_judged_once(pytester, run_suite, monkeypatch):
    pytester.makepyfile(noisy=LOADERS)
    monkeypatch.setenv("WS_NOISY_MARK", str(pytester.path / "mark"))
    (pytester.path / "mark").touch()  # said already: this run's builds are quiet
    case = _case(run_suite(*ARGS, "--workerstart-failure-runs=2", "--workerstart-loader=noisy:NoisyOnce"))
    assert case["outcome"] == "passed" and "runs" not in (case["measurements"] or {}), case
