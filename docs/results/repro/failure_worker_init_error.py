"""Standalone reproducer: after a worker_init_fn error, releasing the error stalls for seconds.

Contract clause ``failure.worker_init_error`` (pytest-workerstart): ``worker_init_fn`` raising
in worker 1 surfaces as an error naming that worker, and once the caller drops the error the
loader's shutdown returns within the failure patience (5 s at least). The error's traceback
usually holds the iterator in a reference cycle, so the shutdown runs from the cyclic garbage
collector, as it does here. Needs only torch and the standard library.

    python failure_worker_init_error.py                           # the loader this script was written for
    python failure_worker_init_error.py mypkg.loaders:Loader [fork|forkserver|spawn]

Exits 1 (printing what it saw) if the error does not name worker 1 or releasing it takes longer
than 5 s, 0 otherwise.
"""

import gc
import importlib
import multiprocessing
import sys
import time

import torch
from torch.utils.data import Dataset

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data.dataloader:DataLoader"
#: seconds the shutdown set off by releasing the error may take (the suite's floor)
PATIENCE_S = 5.0


class Items(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([i])


class InitError(Exception):
    pass


def raise_in_worker_1(worker_id):
    if worker_id == 1:
        raise InitError("worker_init_fn failed")


def main(spec: str, context: str) -> int:
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    loader = loader_class(Items(), batch_size=2, num_workers=3, multiprocessing_context=context,
                          worker_init_fn=raise_in_worker_1)
    held = None
    try:
        for _ in loader:
            pass
    except Exception as exc:
        held = exc  # the caller keeps the error for a while, as a logger or pytest.raises would
    if held is None:
        print("expected: an error naming worker 1; observed: the epoch ended normally")
        return 1
    message = f"{type(held).__name__}: {held}"
    t0 = time.monotonic()
    del held
    gc.collect()
    took = time.monotonic() - t0
    for p in multiprocessing.active_children():
        p.kill()
    if "worker 1" not in message and "worker process 1" not in message:
        print(f"expected: an error naming worker 1; observed: {message.splitlines()[0][:300]}")
        return 1
    if took > PATIENCE_S:
        print(f"expected: the shutdown after the error was released within {PATIENCE_S:.0f} s; observed: it took "
              f"{took:.1f} s ({context})")
        return 1
    print(f"ok: {message.splitlines()[0][:200]}; released in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER, sys.argv[2] if len(sys.argv) > 2 else "spawn"))
