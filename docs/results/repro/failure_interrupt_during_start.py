"""Standalone reproducer: Ctrl-C while workers start leaves the started ones running while the
KeyboardInterrupt is held.

Contract clause ``failure.interrupt_during_start`` (pytest-workerstart): a SIGINT reaching the
main thread while workers start (here: sent from the second ``Process.start()``, as a terminal's
Ctrl-C reaches it; later starts are slowed so it lands while starts are in flight) raises
KeyboardInterrupt in the caller, and no worker is left running while the caller holds it (as a
notebook or a debugger does). Needs only torch and the standard library.

    python failure_interrupt_during_start.py                      # the loader this script was written for
    python failure_interrupt_during_start.py mypkg.loaders:Loader [spawn|forkserver|fork]

Exits 1 (printing what it saw) if no KeyboardInterrupt comes or a worker outlives it, 0 otherwise.
"""

import importlib
import multiprocessing
import multiprocessing.context
import signal
import sys
import threading
import time

import torch
from torch.utils.data import Dataset

#: the loader judged when no SPEC is given (module:attribute)
LOADER = "torch.utils.data.dataloader:DataLoader"
STARTS = []


class Items(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([i])


class Interrupting:
    """``start()`` of a worker process: the second one sends SIGINT to the main thread."""

    def start(self):
        STARTS.append(time.monotonic())
        if len(STARTS) == 2:
            # to the main thread, as Ctrl-C reaches it (also when start() runs in another thread)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            if threading.current_thread() is threading.main_thread():
                time.sleep(0.5)  # the handler runs here, mid-start
        elif len(STARTS) > 2:
            time.sleep(0.5)
        return super().start()


# module level: spawn and forkserver pickle the process object, so its class must be importable
class InterruptingSpawnProcess(Interrupting, multiprocessing.context.SpawnProcess):
    pass


class InterruptingForkServerProcess(Interrupting, multiprocessing.context.ForkServerProcess):
    pass


class InterruptingForkProcess(Interrupting, multiprocessing.context.ForkProcess):
    pass


class InterruptingSpawnContext(multiprocessing.context.SpawnContext):
    Process = InterruptingSpawnProcess


class InterruptingForkServerContext(multiprocessing.context.ForkServerContext):
    Process = InterruptingForkServerProcess


class InterruptingForkContext(multiprocessing.context.ForkContext):
    Process = InterruptingForkProcess


CONTEXTS = {"spawn": InterruptingSpawnContext, "forkserver": InterruptingForkServerContext,
            "fork": InterruptingForkContext}


def main(spec: str, context: str) -> int:
    # Ctrl-C reaches a foreground program as KeyboardInterrupt; a script's background job (and
    # nohup, some CI runners) starts with SIGINT ignored, and Python leaves it so: judge the loader,
    # not how this script was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    module, _, name = spec.partition(":")
    loader_class = getattr(importlib.import_module(module), name)
    loader = loader_class(Items(), batch_size=2, num_workers=3, multiprocessing_context=CONTEXTS[context]())
    held = None
    try:
        next(iter(loader))
        # the first batch may come before the second start began (parallel starts): wait for it
        deadline = time.monotonic() + 60
        while len(STARTS) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
    except KeyboardInterrupt as exc:
        held = exc  # the caller keeps it, as a notebook or a debugger would
    if held is None:
        print(f"expected: KeyboardInterrupt; observed: none ({len(STARTS)} starts)")
        return 1
    deadline = time.monotonic() + 10  # the loader's shutdown may take a moment
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = multiprocessing.active_children()
    if alive:
        print(f"expected: no worker left while the KeyboardInterrupt is held; observed {len(alive)} still "
              f"running 10 s later: {[p.pid for p in alive]}")
        for p in alive:
            p.kill()
        return 1
    print("ok: KeyboardInterrupt reached the caller and no worker was left running")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else LOADER, sys.argv[2] if len(sys.argv) > 2 else "spawn"))
