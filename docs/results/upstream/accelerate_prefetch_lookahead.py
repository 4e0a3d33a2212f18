"""accelerate's DataLoaderShard holds one batch more than prefetch_factor x num_workers.

Standalone: torch, accelerate and the standard library. A dataset records each item it
loads in a file; a slow consumer reads 20 batches of one item and, after each, counts the
items loaded but not yet handed out. torch documents at most prefetch_factor x num_workers
batches loaded in advance; the script exits 1 when the loader under test holds more.

    python accelerate_prefetch_lookahead.py            # accelerate's DataLoaderShard, spawn
    python accelerate_prefetch_lookahead.py fork       # any start method
    python accelerate_prefetch_lookahead.py spawn torch.utils.data:DataLoader   # the baseline
"""

import importlib
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset

WORKERS, PREFETCH, BATCHES = 2, 2, 20


class LoggedItems(Dataset):
    """Item i is tensor([i]); each load appends a line to ``path`` (workers are other processes)."""

    def __init__(self, path: str, n: int):
        self.path, self.n = path, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return torch.tensor([i])

    def loaded(self) -> int:
        with open(self.path) as f:
            return sum(1 for _ in f)


def main() -> int:
    context = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    spec = sys.argv[2] if len(sys.argv) > 2 else "accelerate.data_loader:DataLoaderShard"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    with tempfile.TemporaryDirectory() as tmp:
        ds = LoggedItems(os.path.join(tmp, "loaded.txt"), 40)
        open(ds.path, "w").close()
        loader = cls(ds, batch_size=1, num_workers=WORKERS, prefetch_factor=PREFETCH,
                     multiprocessing_context=context)
        worst = 0
        for consumed, _ in enumerate(loader, start=1):
            time.sleep(0.05)  # a slow consumer: the workers fill every slot they are allowed
            worst = max(worst, ds.loaded() - consumed)
            if consumed == BATCHES:
                break
        del loader
    bound = WORKERS * PREFETCH
    print(f"{spec} ({context}): at most {worst} batches loaded ahead of the consumer; "
          f"prefetch_factor x num_workers = {bound}")
    if worst > bound:
        print(f"FAIL: {worst - bound} batch(es) beyond the documented bound")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
