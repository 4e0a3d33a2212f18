"""Standalone reproducer: an unpicklable ``collate_fn`` under spawn gives an error that does not name it.

Contract clause ``start.unpicklable_argument`` (pytest-workerstart): under spawn and forkserver,
whose workers receive the loader's arguments pickled, a lambda ``collate_fn`` raises at
``iter()`` or the first ``next()`` an error whose message names the argument
(``collate_fn``). Needs only torch and the standard library.

    python start_unpicklable_argument.py                      # the loader this script was written for
    python start_unpicklable_argument.py mypkg.loaders:Loader

Exits 1 (printing the error) if the message does not say ``collate_fn``, 0 otherwise.
"""

import importlib
import re
import sys

import torch
from torch.utils.data import Dataset, default_collate

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data.dataloader:DataLoader"


class Items(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i])


def main(spec: str) -> int:
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    loader = loader_class(Items(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                          collate_fn=lambda batch: default_collate(batch))
    try:
        next(iter(loader))
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
    else:
        print("expected: an error naming collate_fn; observed: a batch (the lambda was not pickled?)")
        return 1
    if not re.search(r"\bcollate_fn\b", message):
        print(f"expected: an error naming collate_fn; observed: {message.splitlines()[0][:300]}")
        return 1
    print(f"ok: {message.splitlines()[0][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER))
