"""The process-state guard fails the self-test that leaves process-global state changed."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
import signal

import pytest
import torch
from torch.utils.data import DataLoader


def _epoch():
    return [b.tolist() for b in DataLoader(torch.arange(4), num_workers=2, multiprocessing_context="fork")]


def test_leaves_torchs_sigchld_handler():
    _epoch()


@pytest.mark.usefixtures("torch_process_state")
def test_restores_it():
    _epoch()


def test_leaves_a_signal_handler():
    signal.signal(signal.SIGUSR1, lambda *a: None)


def test_leaves_an_environment_variable(monkeypatch):
    import os
    os.environ["WS_GUARD_LEFT"] = "1"


@pytest.mark.workerstart_check("digest.first_batch")
def test_a_check_of_a_suite_run_from_the_checkout():
    signal.signal(signal.SIGUSR2, lambda *a: None)  # the loader's doing, judged by the check, not the guard
'''


def test_the_guard_fails_what_leaves_state_changed_and_puts_it_back(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_left=TESTS)
    pytester.makeini("[pytest]\nmarkers = workerstart_check(id): a check of the suite\n")
    result = pytester.runpytest_subprocess("-p", "tests._env_guard", "-p", "no:cacheprovider", "-p", "no:randomly",
                                           timeout=300)
    result.assert_outcomes(passed=5, errors=3)
    out = result.stdout.str()
    assert "ERROR at teardown of test_leaves_torchs_sigchld_handler" in out
    assert "torch's note that its SIGCHLD handler is installed (False -> True)" in out
    assert "ERROR at teardown of test_leaves_a_signal_handler" in out
    assert "ERROR at teardown of test_leaves_an_environment_variable" in out and "WS_GUARD_LEFT" in out
    assert "test_restores_it" not in out.split("short test summary")[-1]


def test_a_dataloader_error_held_past_the_test_is_dropped(torch_process_state):
    """The cause of a flake: a dead worker's iterator, kept alive by its error's traceback,
    kept the worker's pid registered; any later SIGCHLD raised that death again elsewhere."""
    import gc

    import torch
    from torch.utils.data import DataLoader, Dataset

    class Dies(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            import os
            import signal
            if i == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return torch.tensor([i])

    with pytest.raises(Exception) as info:  # torch's RuntimeError, or its fd-fetch race
        list(DataLoader(Dies(), num_workers=2, batch_size=1, multiprocessing_context="fork"))
    held = info  # the traceback's frames hold the iterator, as a test's local would
    assert torch_process_state, "the failed iterator's pids are registered while its error is held"
    del held, info
    gc.collect()
    assert not torch_process_state, "collected, the iterator unregistered its workers' pids"
