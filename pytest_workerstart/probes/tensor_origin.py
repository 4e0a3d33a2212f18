"""Which process put a tensor's storage into shared memory (Linux).

``Tensor.is_shared()`` is true for a batch that crossed the pipe as bytes and
was then moved with ``share_memory_()`` in the driver, so it cannot tell a
zero-copy transfer from a copy. The segment's creator can: torch names every
CPU shared-memory segment ``torch_<creator pid>_<random>_<counter>`` under
both sharing strategies, and this process's ``/proc/self/maps`` shows that
name for the mapping that holds the tensor's data. The naming is torch's, not
a documented API, so :func:`verify` confirms it on the installed torch before
anything is judged by it.
"""

from __future__ import annotations

import functools
import os
import re

_SEGMENT = re.compile(r"/torch_(\d+)_\d+_\d+(?: \(deleted\))?$")


def _mapping_of(address: int) -> str | None:
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


def creator_pid(tensor) -> int | None:
    """The pid that created the shared segment holding ``tensor``'s data, or
    ``None`` when its data is not in a torch shared-memory segment."""
    if tensor.numel() == 0:
        return None
    path = _mapping_of(tensor.data_ptr())
    match = _SEGMENT.search(path or "")
    return int(match.group(1)) if match else None


@functools.cache
def verify() -> None:
    """Raise ``RuntimeError`` if the installed torch does not name segments as expected."""
    import torch

    probe = torch.zeros(4096).share_memory_()
    got = creator_pid(probe)
    if got != os.getpid():
        raise RuntimeError(
            f"torch {torch.__version__} names shared-memory segments differently than expected "
            f"(mapping {_mapping_of(probe.data_ptr())!r}): the creator of a batch's storage cannot be told")
