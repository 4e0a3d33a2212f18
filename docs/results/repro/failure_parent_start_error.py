"""Standalone reproducer: a worker whose start fails leaves the workers started before it running
for as long as the error is referenced.

Contract clause ``failure.parent_start_error`` (pytest-workerstart): when ``Process.start()``
raises for one worker (here the second of three), the error reaches the caller and no worker
process is left running while the caller holds the error (as ``pytest.raises``, a logger or a
debugger does). Needs only torch and the standard library.

    python failure_parent_start_error.py                      # the loader this script was written for
    python failure_parent_start_error.py mypkg.loaders:Loader  # any DataLoader-compatible class

Exits 1 (printing what it saw) if a worker outlives the failed start, 0 otherwise.
"""

import importlib
import multiprocessing
import multiprocessing.context
import sys
import time

import torch
from torch.utils.data import Dataset

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data.dataloader:DataLoader"


class Items(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i])


STARTS = [0]


class SecondStartFailsProcess(multiprocessing.context.SpawnProcess):
    """A spawn worker process whose ``start()`` raises OSError the second time any is started."""

    def start(self):
        STARTS[0] += 1
        if STARTS[0] == 2:
            raise OSError(11, "Resource temporarily unavailable (injected)")
        return super().start()


class SecondStartFails(multiprocessing.context.SpawnContext):
    Process = SecondStartFailsProcess


def main(spec: str) -> int:
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    loader = loader_class(Items(), batch_size=2, num_workers=3, multiprocessing_context=SecondStartFails())
    held = None
    try:
        iter(loader)
    except Exception as exc:
        held = exc  # the caller keeps the error, as pytest.raises or a logger would
        print(f"iter() raised {type(exc).__name__}: {exc}")
    if held is None:
        print("expected: iter() raises the start error; observed: it did not raise")
        return 1
    deadline = time.monotonic() + 20  # the loader's shutdown may take a moment
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = multiprocessing.active_children()
    if alive:
        print(f"expected: no worker left after the failed start; observed {len(alive)} still running "
              f"20 s later while the error is held: {[p.pid for p in alive]}")
        for p in alive:
            p.kill()
        return 1
    print("ok: the error reached the caller and no worker was left running")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER))
