"""exit.clean_interpreter judges what a program writes from the loader's first build on: a
package that prints a warning when it is imported is reported beside the case, not failed;
the same words written at exit fail it. Its Ctrl-C lands where the suite puts it: inside the
dataset, in every worker."""

import pytest

from pytest_workerstart.cores import usable_cores
from pytest_workerstart.harness import clean_exit

FAST = ("--workerstart-context=fork", "--workerstart-profile=quick", "--workerstart-preflight=false",
        "-k", "clean_interpreter")
SAID = "FutureWarning: a dependency's deprecation"


@pytest.mark.timeout(600)
def test_output_before_the_first_build_is_reported_not_judged(pytester, run_suite):
    pytester.makepyfile(noisyimport=f"""
        import sys

        from torch.utils.data import DataLoader  # noqa: F401

        sys.stderr.write("{SAID}\\n")
    """, noisyexit=f"""
        import atexit
        import sys

        from torch.utils.data import DataLoader  # noqa: F401

        atexit.register(lambda: sys.stderr.write("{SAID}\\n"))
    """)
    imported = run_suite(*FAST, "--workerstart-loader=noisyimport:DataLoader")
    (case,) = [c for c in imported.data["checks"] if c["outcome"] != "skipped"]
    assert case["outcome"] == "passed", case
    assert SAID in case["measurements"]["stderr_before_build"]
    at_exit = run_suite(*FAST, "--workerstart-loader=noisyexit:DataLoader")
    (case,) = [c for c in at_exit.data["checks"] if c["outcome"] != "skipped"]
    assert case["outcome"] == "failed" and "stderr is not empty" in case["reason"] and SAID in case["reason"], case


def test_a_long_stderr_is_quoted_by_its_first_and_its_last_lines():
    """A traceback's exception is its last line: the reason keeps it, within a verdict reason's length."""
    lines = ["terminate called without an active exception", "Exception ignored in: <function __del__>",
             "Traceback (most recent call last):", *[f'  File "x.py", line {i}, in f' for i in range(15)],
             "RuntimeError: DataLoader worker (pid 7) is killed by signal: Aborted."]
    said = clean_exit._first_and_last(lines)
    assert said.startswith("terminate called") and said.endswith("killed by signal: Aborted.") and " | ... | " in said
    reason = f"AssertionError: after keyboard interrupt: stderr is not empty ({len(lines)} lines): {said}"
    assert len(reason) <= 500
    assert clean_exit._first_and_last(lines[:4]) == " | ".join(lines[:4])


LOGS_INTERRUPTED_FETCH = """
import sys

from torch.utils.data import DataLoader, Dataset


class _Logged(Dataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        try:
            return self.dataset[i]
        except KeyboardInterrupt:
            sys.stderr.write(f"fetch of sample {i} interrupted\\n")
            raise


class LogsInterruptedFetch(DataLoader):
    def __init__(self, dataset, **kwargs):
        super().__init__(_Logged(dataset), **kwargs)
"""


@pytest.mark.timeout(600)
def test_the_interrupt_lands_inside_the_dataset_every_time(pytester, run_suite):
    """A loader that writes to stderr only when a fetch is interrupted: the Ctrl-C reaches every
    worker inside the dataset, so it fails on both of its runs (not `unstable`), and the case
    records the workers held."""
    pytester.makepyfile(logsint=LOGS_INTERRUPTED_FETCH)
    v = run_suite("--workerstart-context=fork", "--workerstart-profile=full", "--workerstart-preflight=false",
                  "--workerstart-failure-runs=2", "-k", "clean_interpreter and keyboard_interrupt",
                  "--workerstart-loader=logsint:LogsInterruptedFetch")
    (case,) = [c for c in v.data["checks"] if c["outcome"] != "skipped"]
    assert case["outcome"] == "failed" and case["measurements"]["runs"] == ["failed", "failed"], case
    assert "stderr is not empty" in case["reason"] and "interrupted" in case["reason"], case
    assert case["measurements"]["workers_held"] == list(range(min(2, usable_cores()))), case
