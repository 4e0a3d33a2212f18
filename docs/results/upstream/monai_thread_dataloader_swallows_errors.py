"""monai's ThreadDataLoader ends an epoch early, without an error, when loading an item raises.

Standalone: torch, monai and the standard library. A dataset of 20 items whose item 7
raises; the loader's epoch must raise (torch's DataLoader and monai's DataLoader re-raise
the worker's error in the caller). The script exits 1 when the epoch ends without an
error, after fewer items than the dataset has.

    python monai_thread_dataloader_swallows_errors.py              # ThreadDataLoader, spawn
    python monai_thread_dataloader_swallows_errors.py fork         # any start method
    python monai_thread_dataloader_swallows_errors.py spawn monai.data:DataLoader   # the baseline
"""

import importlib
import sys
import threading

import torch
from torch.utils.data import Dataset

ITEMS, BAD = 20, 7


class FailsAtOneItem(Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        if i == BAD:
            raise ValueError(f"item {i} cannot be loaded")
        return torch.tensor([i])


def main() -> int:
    context = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    spec = sys.argv[2] if len(sys.argv) > 2 else "monai.data:ThreadDataLoader"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    in_threads = []  # what a background thread raised (Python would only print it)
    threading.excepthook = lambda args: in_threads.append(args.exc_value)
    loader = cls(FailsAtOneItem(), batch_size=2, num_workers=2, multiprocessing_context=context)
    served = 0
    try:
        for batch in loader:
            served += len(batch)
    except Exception as exc:  # any error that reaches the caller is the expected outcome
        print(f"{spec} ({context}): the epoch raised {type(exc).__name__} after {served} of {ITEMS} items")
        print("ok")
        return 0
    print(f"{spec} ({context}): the epoch ended without an error after {served} of {ITEMS} items")
    for exc in in_threads:
        print(f"  raised in a background thread instead: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    print(f"FAIL: {ITEMS - served} items never served and nothing raised to the caller")
    return 1


if __name__ == "__main__":
    sys.exit(main())
