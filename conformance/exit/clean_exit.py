"""``exit.clean_interpreter``: a script's use of the loader, then the interpreter's exit (judged
from outside by :mod:`pytest_workerstart.harness.clean_exit`).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

from pytest_workerstart import scenarios
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.probes.faults import wait_for_file

#: What a training script's module globals still hold when the interpreter exits.
_HELD_AT_EXIT: list = []


def scenario_clean_exit(loader: dict, context: str, ending: str, num_workers: int,
                        parallelism: int | None) -> dict[str, Any]:
    """Use the loader as a script does, then let the interpreter exit (judged from outside).

    ``exhaustion``: one epoch to the end. ``persistent``: two epochs with persistent
    workers (and ``pin_memory`` where an accelerator exists), the loader still
    referenced at exit. ``early_break``: ``for batch in loader: break``, the loader and
    the batch still referenced at exit. ``keyboard_interrupt``: Ctrl-C as a terminal
    sends it (SIGINT to the whole process group: driver and workers) in batch 2, once
    every worker is inside the dataset (:class:`HeldDataset`), caught by the script,
    which then ends.
    """
    import torch

    under_test = scenarios.rebuild(loader, context)
    before_build = _stderr_offset()  # what importing the loader's packages printed is not exit noise
    kw: dict[str, Any] = {}
    if ending == "persistent":
        kw = {"persistent_workers": True, "pin_memory": torch.accelerator.is_available()}
    marks = tempfile.mkdtemp(prefix="workerstart-held-") if ending == "keyboard_interrupt" else None
    dataset = WorkerTagDataset(16) if marks is None else HeldDataset(16, BATCH * INTERRUPT_AT, marks)
    dl = under_test.make(dataset, num_workers=num_workers, multiprocessing_context=context,
                         parallelism=parallelism, batch_size=BATCH, **kw)
    batches, held = 0, None
    if ending == "exhaustion":
        batches = sum(1 for _ in dl)
    elif ending == "persistent":
        for _epoch in range(2):
            for batch in dl:
                batches += 1
        _HELD_AT_EXIT.extend([dl, batch])
    elif ending == "early_break":
        for batch in dl:
            batches += 1
            break
        _HELD_AT_EXIT.extend([dl, batch])
    elif ending == "keyboard_interrupt":
        try:
            for batch in dl:
                batches += 1
                if batches == INTERRUPT_AT:
                    held = _wait_held(marks, num_workers)
                    os.killpg(os.getpgrp(), signal.SIGINT)  # this scenario's own session only
                    time.sleep(30)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the SIGINT sent to the process group raised no KeyboardInterrupt")
        finally:
            shutil.rmtree(marks, ignore_errors=True)
    else:
        raise ValueError(f"unknown ending {ending!r}")
    return {"batches": batches, "stderr_before_build": before_build, "workers_held": held}


BATCH = 2
#: the batch in which Ctrl-C comes
INTERRUPT_AT = 2
#: how long the driver waits for every worker to be inside the dataset: each has had its
#: index since the batches before were delivered, so only a loader that never sends it waits it out
HOLD_PATIENCE_S = 10.0


class HeldDataset(WorkerTagDataset):
    """A :class:`WorkerTagDataset` whose samples from ``first_held`` on hold the worker
    fetching them (after creating ``marks/held-<worker id>``) until a signal ends it: where a
    Ctrl-C lands in a worker is then the suite's choice (inside the dataset, as during a
    long fetch), not the machine's (waiting for an index, or its queue's feeder mid-send).

    Only a worker process's main thread whose SIGINT handler raises ``KeyboardInterrupt``
    (Python's default, torch's workers') is held: the signal is sure to end that hold. A thread
    of the driver, or a worker that handles or ignores SIGINT, serves its samples as usual and
    is not counted as held. Removing ``marks`` (the driver does once its script ends) lets go
    of any hold that is left."""

    def __init__(self, n: int, first_held: int, marks: str):
        super().__init__(n)
        self.first_held, self.marks = first_held, marks

    def __getitem__(self, i: int):
        if self._index(i) >= self.first_held:
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
            if info is None or not _interrupt_raises_here():
                return super().__getitem__(i)
            try:
                open(os.path.join(self.marks, f"held-{info.id}"), "w").close()
            except FileNotFoundError:  # let go already
                return super().__getitem__(i)
            while os.path.isdir(self.marks):
                time.sleep(0.02)
        return super().__getitem__(i)


def _interrupt_raises_here() -> bool:
    return threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _wait_held(marks: str, num_workers: int) -> list[int]:
    """The workers inside the dataset once all are, or ``HOLD_PATIENCE_S`` has passed."""
    deadline = time.monotonic() + HOLD_PATIENCE_S
    for w in range(num_workers):
        wait_for_file(os.path.join(marks, f"held-{w}"), max(0.0, deadline - time.monotonic()))
    return [w for w in range(num_workers) if os.path.exists(os.path.join(marks, f"held-{w}"))]


def _stderr_offset() -> int | None:
    """Bytes written to stderr so far (None where it is not a file)."""
    import sys

    sys.stderr.flush()
    try:
        return os.lseek(2, 0, os.SEEK_CUR)
    except OSError:
        return None
