"""torchdata's StatefulDataLoader shuffles differently with and without workers for one seed.

Standalone: torch, torchdata and the standard library. The script reads one shuffled epoch of
``range(32)`` (``batch_size=4``, ``generator=torch.Generator().manual_seed(7)``) with
``num_workers=0`` and with ``num_workers=2`` and exits 1 when the two index orders differ, as
torch's DataLoader keeps them equal for a seeded generator.

    python torchdata_shuffle_depends_on_workers.py [CONTEXT] [MODULE:CLASS]
    python torchdata_shuffle_depends_on_workers.py fork                               # StatefulDataLoader
    python torchdata_shuffle_depends_on_workers.py fork torch.utils.data:DataLoader   # the baseline
"""

import importlib
import sys

import torch


def epoch(cls, num_workers: int, context: str) -> list[int]:
    loader = cls(list(range(32)), batch_size=4, shuffle=True, num_workers=num_workers,
                 generator=torch.Generator().manual_seed(7),
                 multiprocessing_context=context if num_workers else None)
    return [int(i) for batch in loader for i in batch]


def main() -> int:
    context = sys.argv[1] if len(sys.argv) > 1 else "fork"
    spec = sys.argv[2] if len(sys.argv) > 2 else "torchdata.stateful_dataloader:StatefulDataLoader"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    alone, with_workers = epoch(cls, 0, context), epoch(cls, 2, context)
    print(f"{spec}, seed 7, num_workers=0: {alone[:8]} ...")
    print(f"{spec}, seed 7, num_workers=2 ({context}): {with_workers[:8]} ...")
    if sorted(alone) != list(range(32)) or sorted(with_workers) != list(range(32)):
        print("FAIL: an epoch does not serve each of 0..31 once")
        return 1
    if alone != with_workers:
        print("FAIL: the same seeded generator gives another order with workers than without")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
