"""Standalone reproducer: a worker killed while booting leaves the other workers running while
the error is held.

Contract clause ``failure.child_killed_during_start`` (pytest-workerstart): a worker killed by
SIGKILL during its boot (here: ``worker_init_fn`` of worker 1 kills its own process) gives an
error naming that worker (its number or pid), and no worker is left running while the caller
holds the error (as ``pytest.raises``, a logger or a debugger does). Needs only torch and the
standard library.

    python failure_child_killed_during_start.py                      # the loader this script was written for
    python failure_child_killed_during_start.py mypkg.loaders:Loader [spawn|forkserver|fork]

Exits 1 (printing what it saw) if the error does not name worker 1 or a worker outlives it,
0 otherwise.
"""

import importlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data.dataloader:DataLoader"


class Items(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([i])


class KillWorker1:
    """``worker_init_fn``: worker 1 writes its pid (the error may name it by pid), then kills itself."""

    def __init__(self, pid_file):
        self.pid_file = pid_file

    def __call__(self, worker_id):
        if worker_id == 1:
            with open(self.pid_file, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


def main(spec: str, context: str) -> int:
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    pid_file = os.path.join(tempfile.mkdtemp(), "worker1.pid")
    loader = loader_class(Items(), batch_size=2, num_workers=3, multiprocessing_context=context,
                          worker_init_fn=KillWorker1(pid_file))
    held = None
    try:
        for _ in loader:
            pass
    except Exception as exc:
        held = exc  # the caller keeps the error, as pytest.raises or a logger would
    if held is None:
        print("expected: an error naming worker 1; observed: the epoch ended normally")
        return 1
    message = f"{type(held).__name__}: {held}"
    with open(pid_file) as f:
        pid = f.read().strip()
    if "worker 1" not in message and "worker process 1" not in message and pid not in message:
        print(f"expected: an error naming worker 1 (pid {pid}); observed: {message.splitlines()[0][:300]}")
        return 1
    deadline = time.monotonic() + 20  # the loader's shutdown may take a moment
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = multiprocessing.active_children()
    if alive:
        print(f"expected: no worker left while the error is held; observed {len(alive)} still running 20 s "
              f"later: {[p.pid for p in alive]}")
        for p in alive:
            p.kill()
        return 1
    print(f"ok: {message.splitlines()[0][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER, sys.argv[2] if len(sys.argv) > 2 else "spawn"))
