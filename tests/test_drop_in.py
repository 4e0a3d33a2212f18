"""The reference against torch's DataLoader where user code can tell them apart.

Each case runs the same thing on torch's ``DataLoader`` and on the reference and
compares what a user observes. Differences that remain are listed, with their
reasons, in docs/reference.md ("Where it differs from torch").
"""

import os
import re
import signal
from typing import List  # noqa: UP035 - the spelling older annotated code uses

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pytest_workerstart.reference import ParallelStartDataLoader

LOADERS = {"torch": (DataLoader, {}), "reference-p1": (ParallelStartDataLoader, {"worker_start_parallelism": 1}),
           "reference-p2": (ParallelStartDataLoader, {"worker_start_parallelism": 2})}


class DiesBySignal(Dataset):
    """Item 3 kills the worker that computes it with ``signum``."""

    def __init__(self, signum: int):
        self.signum = signum

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), self.signum)
        return torch.tensor([i])


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_type_subscription(loader):
    """Annotated code (``def make() -> DataLoader[Batch]``) keeps working when the class is swapped."""
    cls, _ = LOADERS[loader]
    for item in (List[torch.Tensor], list[torch.Tensor]):  # noqa: UP006
        assert cls[item].__origin__ is cls


def _error(loader: str, context: str, signum: int) -> BaseException:
    cls, kwargs = LOADERS[loader]
    dl = cls(DiesBySignal(signum), num_workers=2, batch_size=1, multiprocessing_context=context, **kwargs)
    with pytest.raises(RuntimeError) as info:
        for _ in dl:
            pass
    return info.value


#: torch's two wordings for a dead worker: its SIGCHLD handler's, which names the signal (it sees only
#: the driver's own children, so never a forkserver's workers), and its liveness check's, which
#: wins when it runs first.
TORCH_EXITED = re.compile(r"^DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly")


@pytest.mark.parametrize("context, signum", [("fork", signal.SIGSEGV), ("fork", signal.SIGKILL),
                                             ("forkserver", signal.SIGSEGV), ("spawn", signal.SIGSEGV)])
def test_a_worker_killed_by_a_signal_is_named_in_torchs_words(context, signum):
    """torch names the signal only when its SIGCHLD handler wins the race; the reference always does."""
    name = re.escape(signal.strsignal(signum))
    wording = re.compile(rf"^DataLoader worker \(pid \d+\) is killed by signal: {name}\.")
    torch_error = _error("torch", context, signum)
    assert wording.match(str(torch_error)) or TORCH_EXITED.match(str(torch_error)), (
        f"torch's wording changed: {torch_error}")
    for loader in ("reference-p1", "reference-p2"):
        error = _error(loader, context, signum)
        assert isinstance(error, RuntimeError)
        assert wording.match(str(error)), f"{loader}: {error}"
