"""Batch digests: SHA-256 over a canonical walk, stable across processes and runs.

Encoding (version 1), each node written as a type tag then its content:

* ``dict``/mapping: ``D`` + count, then (key, value) pairs sorted by the digest
  of the key, so insertion order does not matter;
* ``list`` ``L``, ``tuple`` ``T``, namedtuple ``N`` + type name + field names;
  each + count + items in order;
* torch tensor ``X``: dtype name, shape, then the C-contiguous CPU bytes;
* numpy array ``A``: dtype ``str`` (includes byte order), shape, C-contiguous bytes;
* ``bool`` ``B``, ``int`` ``I`` (decimal), ``float`` ``F`` (``float.hex``),
  ``complex`` ``C``, ``str`` ``S`` (UTF-8), ``bytes`` ``Y``, ``None`` ``0``.

Every variable-length field is length-prefixed, so different trees can't
collide by concatenation. Anything else raises ``TypeError``: an unhashable
batch is a usage error, not a silent ``repr``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

VERSION = b"workerstart-digest-v1"


def _put(h, tag: bytes, payload: bytes = b"") -> None:
    h.update(tag)
    h.update(struct.pack("<Q", len(payload)))
    h.update(payload)


def _walk(h, obj: Any) -> None:
    mod = type(obj).__module__
    if obj is None:
        _put(h, b"0")
    elif isinstance(obj, bool):
        _put(h, b"B", b"1" if obj else b"0")
    elif isinstance(obj, int):
        _put(h, b"I", str(obj).encode())
    elif isinstance(obj, float):
        _put(h, b"F", obj.hex().encode())
    elif isinstance(obj, complex):
        _put(h, b"C", f"{obj.real.hex()},{obj.imag.hex()}".encode())
    elif isinstance(obj, str):
        _put(h, b"S", obj.encode("utf-8"))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        _put(h, b"Y", bytes(obj))
    elif mod.startswith("torch") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        t = obj.detach().to("cpu").contiguous()
        _put(h, b"X", f"{t.dtype}|{tuple(t.shape)}".encode())
        # Viewing as bytes works for every dtype (bfloat16 has no numpy twin).
        data = t.reshape(-1).view(_byte_dtype()).numpy().tobytes() if t.numel() else b""
        _put(h, b"x", data)
    elif mod == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "tobytes"):
        import numpy as np

        a = np.ascontiguousarray(obj)
        _put(h, b"A", f"{a.dtype.str}|{a.shape}".encode())
        _put(h, b"a", a.tobytes())
    elif isinstance(obj, Mapping):
        items = sorted(((batch_digest(k), k, v) for k, v in obj.items()), key=lambda kv: kv[0])
        _put(h, b"D", str(len(items)).encode())
        for kd, _, v in items:
            _put(h, b"k", kd.encode())
            _walk(h, v)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        _put(h, b"N", f"{type(obj).__name__}|{','.join(obj._fields)}|{len(obj)}".encode())
        for item in obj:
            _walk(h, item)
    elif isinstance(obj, (list, tuple)):
        _put(h, b"L" if isinstance(obj, list) else b"T", str(len(obj)).encode())
        for item in obj:
            _walk(h, item)
    elif mod == "numpy" and hasattr(obj, "item"):  # numpy scalar
        _walk(h, obj.item())
    else:
        raise TypeError(f"cannot digest a {type(obj).__module__}.{type(obj).__qualname__}")


def _byte_dtype():
    import torch

    return torch.uint8


def batch_digest(batch: Any) -> str:
    """Hex SHA-256 of ``batch`` under the canonical encoding above."""
    h = hashlib.sha256(VERSION)
    _walk(h, batch)
    return h.hexdigest()


def in_process_truth(dataset, factory=None, **loader_kwargs) -> Any:
    """The first batch the same dataset and sampler give with ``num_workers=0``.

    ``factory`` is the loader under test (default: torch's ``DataLoader``): a
    loader is compared with itself in-process, so a different but consistent
    sampler (torchdata's stateful one) is not mistaken for a start defect.
    """
    if factory is None:
        from torch.utils.data import DataLoader as factory
    kwargs = {k: v for k, v in loader_kwargs.items()
              if k not in ("num_workers", "multiprocessing_context", "prefetch_factor", "persistent_workers",
                           "worker_init_fn", "timeout", "pin_memory", "in_order")}
    return next(iter(factory(dataset, num_workers=0, **kwargs)))
