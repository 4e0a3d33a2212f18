"""monai's DataLoader fails with batch_size=None: it applies list_data_collate to each sample.

Standalone: torch, monai and the standard library. With ``batch_size=None`` (automatic
batching off), torch's DataLoader hands each sample to ``collate_fn`` on its own, and by
default converts it (``default_convert``). monai's DataLoader always sets
``collate_fn=list_data_collate``, which expects a list of samples; an epoch over plain
samples (an int, a tensor, a dict of tensors) then raises in the worker. The script exits 1
when the epoch raises, 0 when it serves every sample as torch does.

    python monai_batch_size_none_collate.py                                  # monai's DataLoader, spawn
    python monai_batch_size_none_collate.py fork                             # any start method
    python monai_batch_size_none_collate.py spawn torch.utils.data:DataLoader  # the baseline
"""

import importlib
import sys

import torch
from torch.utils.data import Dataset

ITEMS = 6


class DictSamples(Dataset):
    """Item i is {"image": tensor([i, i]), "label": i}: what a monai transform chain returns."""

    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        return {"image": torch.tensor([i, i]), "label": i}


def main() -> int:
    context = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    spec = sys.argv[2] if len(sys.argv) > 2 else "monai.data:DataLoader"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    loader = cls(DictSamples(), batch_size=None, num_workers=2, multiprocessing_context=context)
    try:
        labels = [int(sample["label"]) for sample in loader]
    except Exception as exc:  # the outcome this script reports
        first = str(exc).strip().splitlines()[-1]
        print(f"{spec} ({context}), batch_size=None: the epoch raised {type(exc).__name__}: {first}")
        print("FAIL: torch's DataLoader serves each sample unbatched with the same arguments")
        return 1
    print(f"{spec} ({context}), batch_size=None: served labels {labels}")
    if sorted(labels) != list(range(ITEMS)):
        print(f"FAIL: expected each of the {ITEMS} samples once")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
