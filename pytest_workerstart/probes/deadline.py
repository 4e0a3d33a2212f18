"""A deadline for one step that waits on the loader (``iter()``, a batch).

``with deadline("next() #1", 40.0, on_expiry=dump):`` runs the block; if it
has not returned when the deadline passes, a watchdog thread calls
``on_expiry()`` (which gathers the stacks of every thread and worker while the
loader is still stuck) and then interrupts the main thread with ``SIGUSR2``,
whose handler raises :class:`StepTimeout` there. The loader's own cleanup
(``except``/``finally`` blocks) runs as the exception unwinds.

A signal, not pytest-timeout's SIGALRM: the two must not share a timer, and
pytest-timeout stays the outer, last-resort limit of the whole check. Only
the main thread can be interrupted this way; elsewhere the block runs
unbounded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator

import pytest

SIGNAL = signal.SIGUSR2


class StepTimeout(pytest.fail.Exception):
    """A step that waits on the loader did not finish within its deadline."""

    def __init__(self, step: str, seconds: float, details: str = ""):
        self.step = step
        self.seconds = seconds
        msg = f"the loader hung: {step} did not return within {seconds:.0f} s"
        super().__init__(msg + (f"\n{details}" if details else ""), pytrace=False)


@contextlib.contextmanager
def deadline(step: str, seconds: float | None, on_expiry: Callable[[], str] | None = None) -> Iterator[None]:
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    details: list[str] = []
    fired = threading.Event()
    done = threading.Event()
    main = threading.main_thread().ident

    def handler(signum, frame):
        if fired.is_set() and not done.is_set():
            done.set()
            raise StepTimeout(step, seconds, "".join(details))

    def watch():
        if done.wait(seconds):
            return
        if on_expiry is not None:
            try:
                details.append(on_expiry())
            except Exception as exc:  # noqa: BLE001 - diagnostics must not mask the hang
                details.append(f"(could not gather stacks: {exc!r})")
        fired.set()
        while not done.is_set():  # a handler can be delayed by C code; keep knocking
            signal.pthread_kill(main, SIGNAL)
            done.wait(1.0)

    old = signal.signal(SIGNAL, handler)
    watcher = threading.Thread(target=watch, name="workerstart-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(SIGNAL, old)


def thread_stacks() -> str:
    """Every thread's stack in this process (the driver), as text."""
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "workerstart-deadline":
            continue
        out.append(f"--- driver thread {names.get(ident, ident)} ---\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def measure_boot_cost(timeout: float = 120.0) -> float:
    """Seconds a fresh interpreter needs to import torch's DataLoader (one worker's boot)."""
    import subprocess
    import sys

    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch.utils.data"], check=True, timeout=timeout,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0
