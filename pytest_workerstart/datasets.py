"""Deterministic datasets for the conformance suite (picklable, tiny, torch only).

Each sample records what the check needs to observe from outside the loader:
which worker served it (``get_worker_info``), with which seed, in which pid.
Every map-style dataset ends: an index outside ``range(len)`` raises
``IndexError``, so a loader that iterates by index until it fails stops.
"""

from __future__ import annotations

import collections
import operator
import os
import random
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

__all__ = [
    "Pair",
    "NestedMapDataset",
    "WorkerTagDataset",
    "AugmentedDataset",
    "ShardedRange",
    "rng_draws",
    "RngDrawDataset",
    "ShuffledShards",
    "CountingDataset",
    "CorruptItemDataset",
    "BigPickleDataset",
    "UnpicklableDataset",
    "PreallocatedDataset",
]

Pair = collections.namedtuple("Pair", ["left", "right"])


def _worker() -> tuple[int, int, int]:
    info = get_worker_info()
    if info is None:
        return -1, torch.initial_seed() % 2**63, os.getpid()
    return info.id, torch.initial_seed(), os.getpid()


class _Finite(Dataset):
    """``n`` items, indexed 0..n-1 (anything else raises ``IndexError``)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def _index(self, i) -> int:
        i = operator.index(i)
        if not 0 <= i < self.n:
            raise IndexError(f"{type(self).__name__} index {i} out of range(0, {self.n})")
        return i


class NestedMapDataset(_Finite):
    """Map-style; nested dict/tuple/namedtuple samples, a pure function of the index."""

    def __init__(self, n: int = 32):
        super().__init__(n)

    def __getitem__(self, i: int):
        i = self._index(i)
        g = torch.Generator().manual_seed(1000 + i)
        return {
            "index": i,
            "x": torch.randn(3, 4, generator=g),
            "meta": (float(i) / 3, {"name": f"item-{i}", "pair": Pair(i, torch.arange(3, dtype=torch.int16) + i)}),
        }


class WorkerTagDataset(_Finite):
    """Map-style; each sample says which worker served it, its seed and pid."""

    def __init__(self, n: int = 16, delay: float = 0.0):
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i: int):
        i = self._index(i)
        if self.delay:
            time.sleep(self.delay)
        worker, seed, pid = _worker()
        return {"index": i, "worker": worker, "seed": seed, "pid": pid}


class AugmentedDataset(_Finite):
    """Per-worker random augmentation: equal across p only if seeds are."""

    def __init__(self, n: int = 16):
        super().__init__(n)

    def __getitem__(self, i: int):
        i = self._index(i)
        return torch.full((2, 2), float(i)) + torch.rand(2, 2)


class ShardedRange(IterableDataset):
    """Yields range(n), sharded across workers by ``get_worker_info()``, and
    across distributed ranks when given ``rank`` and ``world_size``: shard
    ``rank * num_workers + worker_id`` of ``world_size * num_workers``."""

    def __init__(self, n: int = 24, shard: bool = True, rank: int = 0, world_size: int = 1):
        self.n = n
        self.shard = shard
        self.rank = rank
        self.world_size = world_size

    def __len__(self) -> int:
        """Samples this rank yields in an epoch, over all its workers (as torch's len() reads it)."""
        return self.n if not self.shard else len(range(self.rank, self.n, self.world_size))

    def __iter__(self):
        info = get_worker_info()
        if not self.shard:
            return iter(range(self.n))
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        return iter(range(self.rank * workers + wid, self.n, self.world_size * workers))


def rng_draws() -> dict[str, int]:
    """One draw from each global generator a worker hands to user code (torch,
    ``random``, NumPy: what augmentations draw from), as int64-safe integers; -1 for
    each outside a worker, so that the test process's own generators are never touched."""
    if get_worker_info() is None:
        return dict.fromkeys(("torch", "random", "numpy"), -1)
    try:
        import numpy as np
    except ImportError:  # torch runs without NumPy; its stream is then not observed
        drawn_np = -1
    else:
        drawn_np = int(np.random.randint(0, 2**62, dtype=np.int64))
    return {"torch": int(torch.randint(0, 2**62, ())), "random": random.getrandbits(62), "numpy": drawn_np}


class RngDrawDataset(_Finite):
    """Map-style; each sample carries its index, its worker and one draw from each global generator."""

    def __init__(self, n: int = 12):
        super().__init__(n)

    def __getitem__(self, i: int):
        i = self._index(i)
        return {"index": i, "worker": _worker()[0], **rng_draws()}


class ShuffledShards(IterableDataset):
    """Iterable; worker w takes ``range(w, n, num_workers)``, shuffles it with torch's global
    generator (as a shuffle buffer would; in order outside a worker) and yields samples shaped
    like :class:`RngDrawDataset`'s."""

    def __init__(self, n: int = 12):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        shard = list(range(wid, self.n, workers))
        # outside a worker the test process's own generator is not ours to draw from
        order = torch.randperm(len(shard)).tolist() if info is not None else range(len(shard))
        for k in order:
            yield {"index": shard[k], "worker": _worker()[0], **rng_draws()}


class CountingDataset(_Finite):
    """Appends one line per fetched index to ``path``: requested-but-unconsumed
    items can then be counted from outside."""

    def __init__(self, path: str, n: int = 48):
        super().__init__(n)
        self.path = path

    def __getitem__(self, i: int):
        i = self._index(i)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{i}\n".encode())
        finally:
            os.close(fd)
        return i

    def fetched(self) -> int:
        try:
            with open(self.path, "rb") as f:
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0


class CorruptItemDataset(WorkerTagDataset):
    """A WorkerTagDataset whose item ``bad`` raises ``ValueError`` (in whichever worker fetches it)."""

    def __init__(self, n: int = 16, bad: int = 5):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int):
        if operator.index(i) == self.bad:
            raise ValueError(f"item {i} is corrupt")
        return super().__getitem__(i)


class BigPickleDataset(WorkerTagDataset):
    """A WorkerTagDataset whose pickle exceeds the 64 KiB pipe buffer, so that a
    spawn ``Process.start()`` blocks until the child has booted (as real datasets do)."""

    def __init__(self, n: int = 16, payload_kib: int = 256):
        super().__init__(n)
        self.payload = os.urandom(payload_kib * 1024)


class UnpicklableDataset(WorkerTagDataset):
    """A WorkerTagDataset holding a lambda: fine in-process and under fork, but
    spawn and forkserver must pickle the dataset for every worker, and cannot."""

    def __init__(self, n: int = 8):
        super().__init__(n)
        self.transform = lambda item: item

    def __getitem__(self, i: int):
        return self.transform(super().__getitem__(i))


class PreallocatedDataset(_Finite):
    """Items are views of one tensor allocated at construction: fetching allocates
    nothing that outlives the batch, so a worker's memory should not grow per epoch."""

    def __init__(self, n: int = 32, item_kib: int = 64):
        super().__init__(n)
        self.table = torch.arange(n * item_kib * 256, dtype=torch.float32).reshape(n, item_kib * 256)

    def __getitem__(self, i: int):
        return self.table[self._index(i)]
