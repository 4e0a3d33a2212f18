"""``exit.clean_interpreter``: a script's use of the loader, then the interpreter's exit (judged
from outside by :mod:`pytest_workerstart.harness.clean_exit`).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from pytest_workerstart import scenarios
from pytest_workerstart.datasets import WorkerTagDataset

#: What a training script's module globals still hold when the interpreter exits.
_HELD_AT_EXIT: list = []


def scenario_clean_exit(loader: dict, context: str, ending: str, num_workers: int,
                        parallelism: int | None) -> dict[str, Any]:
    """Use the loader as a script does, then let the interpreter exit (judged from outside).

    ``exhaustion``: one epoch to the end. ``persistent``: two epochs with persistent
    workers (and ``pin_memory`` where an accelerator exists), the loader still
    referenced at exit. ``early_break``: ``for batch in loader: break``, the loader and
    the batch still referenced at exit. ``keyboard_interrupt``: Ctrl-C as a terminal
    sends it (SIGINT to the whole process group: driver and workers) in batch 2,
    caught by the script, which then ends.
    """
    import signal

    import torch

    under_test = scenarios.rebuild(loader, context)
    before_build = _stderr_offset()  # what importing the loader's packages printed is not exit noise
    kw: dict[str, Any] = {}
    if ending == "persistent":
        kw = {"persistent_workers": True, "pin_memory": torch.accelerator.is_available()}
    dl = under_test.make(WorkerTagDataset(16), num_workers=num_workers, multiprocessing_context=context,
                         parallelism=parallelism, batch_size=2, **kw)
    batches = 0
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
                if batches == 2:
                    os.killpg(os.getpgrp(), signal.SIGINT)  # this scenario's own session only
                    time.sleep(30)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the SIGINT sent to the process group raised no KeyboardInterrupt")
    else:
        raise ValueError(f"unknown ending {ending!r}")
    return {"batches": batches, "stderr_before_build": before_build}


def _stderr_offset() -> int | None:
    """Bytes written to stderr so far (None where it is not a file)."""
    import sys

    sys.stderr.flush()
    try:
        return os.lseek(2, 0, os.SEEK_CUR)
    except OSError:
        return None
