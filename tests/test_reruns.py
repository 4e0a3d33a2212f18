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


#: loaders whose defect shows on the first iterator only (a marker file says it happened): one
#: leaks a thread past the exit timeout, one serves an altered first batch
ONCE = """
    import os
    import threading
    import time

    import torch
    from torch.utils.data import DataLoader

    def first_time():
        mark = os.environ["WS_ONCE_MARK"]
        if os.path.exists(mark):
            return False
        open(mark, "a").close()
        return True

    class LeaksOnce(DataLoader):
        def __iter__(self):
            if first_time():
                threading.Thread(target=time.sleep, args=(8,), daemon=True).start()
            return super().__iter__()

    class AltersOnce(DataLoader):
        def __iter__(self):
            it = super().__iter__()
            if not first_time():
                return it

            def altered():
                for k, batch in enumerate(it):
                    yield torch.as_tensor(batch) + 1 if k == 0 else batch
            return altered()
"""


@pytest.mark.parametrize("loader, select, check_id, reason", [
    ("LeaksOnce", "leaks.clean_exit and exhaustion", "leaks.clean_exit",
     "unstable: failed 1 of 2: after exhaustion: leaked 1 thread"),
    ("AltersOnce", "digest.first_batch and default_map", "digest.first_batch", "unstable: failed 1 of 2: at "),
])
def test_a_check_in_the_pytest_process_observes_anew(pytester, run_suite, monkeypatch, loader, select, check_id,
                                                     reason):
    """A check judged in the pytest process (one whose run other checks share included) is judged
    again on a fresh run of the loader, not on what its failed run observed."""
    pytester.makepyfile(once=ONCE)
    monkeypatch.setenv("WS_ONCE_MARK", str(pytester.path / "mark"))
    v = run_suite("--workerstart-context=fork", NO_PREFLIGHT, "--workerstart-profile=quick",
                  "--workerstart-parallelism-kwarg=none", "--workerstart-failure-runs=2",
                  f"--workerstart-loader=once:{loader}", "-k", select)
    (case,) = [c for c in v.data["checks"] if c["id"] == check_id and c["outcome"] != "skipped"]
    assert case["outcome"] == "failed", case
    assert case["reason"].removeprefix("Failed: ").startswith(reason), case["reason"]
    assert case["measurements"]["runs"] == ["failed", "passed"], case["measurements"]
