"""A deadline for one step that waits on the loader (``iter()``, a batch).

``with deadline("next() #1", 40.0, on_expiry=dump):`` runs the block; if it
has not returned when the deadline passes, a watchdog thread calls
``on_expiry()`` (which gathers the stacks of every thread and worker while the
loader is still stuck) and then interrupts the main thread with ``SIGUSR2``,
whose handler raises :class:`StepTimeout` there. The loader's own cleanup
(``except``/``finally`` blocks) runs as the exception unwinds. A block that
returns after its deadline (the exception swallowed on the way, as Python does
with one raised in ``__del__``) raises it on leaving the ``with``.

The same watchdog guards memory: ``guard()`` is called every ``GUARD_EVERY_S``
and a message it returns (a runaway loader's memory) stops the step
the same way, with :class:`StepAborted` naming what was exceeded.

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
from collections.abc import Callable, Iterator

import pytest

SIGNAL = signal.SIGUSR2
GUARD_EVERY_S = 0.5


class StepAborted(pytest.fail.Exception):
    """A step that waits on the loader was stopped by its watchdog."""

    kind = "aborted"

    def __init__(self, step: str, message: str, details: str = ""):
        self.step = step
        super().__init__(message + (f"\n{details}" if details else ""), pytrace=False)

    def add_cleanup(self, done: str) -> None:
        """Say on the first line (the verdict's reason) what the suite cleaned up after the stop."""
        first, sep, rest = self.msg.partition("\n")
        self.msg = f"{first}; the suite {done}{sep}{rest}"


class StepTimeout(StepAborted):
    """A step that waits on the loader did not finish within its deadline."""

    kind = "hang"

    def __init__(self, step: str, seconds: float, details: str = ""):
        self.seconds = seconds
        super().__init__(step, f"the loader hung: {step} did not return within {seconds:.0f} s", details)


class MemoryExceeded(StepAborted):
    kind = "memory"


class StepOverdue(StepAborted):
    """A step past a bound that moves with what the step has seen so far (``overdue``)."""

    kind = "hang"


def memory_limit_bytes(gib: float | None) -> int:
    """``--workerstart-memory-limit`` in bytes; by default half of this machine's memory."""
    import psutil

    return int(gib * 2**30) if gib is not None else psutil.virtual_memory().total // 2


def tree_memory_over(limit_bytes: int, root: int | None = None) -> Callable[[], str | None]:
    """A guard: the memory of ``root`` (default: this process) and its descendants, described
    when above ``limit_bytes``, else None.

    Memory is the proportional set size (PSS): a page shared by k processes counts 1/k in each,
    so the workers of a forkserver or of ``fork``, which share the pages their parent loaded, are
    not counted once per process as resident memory would count them. Reading PSS walks page
    tables (milliseconds per large process), and PSS never exceeds resident memory, so resident
    memory is summed first and PSS is read only when that sum is over the limit. Where the
    platform gives no PSS, resident memory is the measure.
    """
    import psutil

    top = psutil.Process(root)

    def sizes(tree: list, measure: Callable) -> list[tuple[int, int]]:
        out = []
        for p in tree:
            try:
                out.append((measure(p), p.pid))
            except psutil.Error:  # gone since the listing
                continue
        return out

    def guard() -> str | None:
        try:
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            return None
        rss = sizes(tree, lambda p: p.memory_info().rss)
        if sum(size for size, _ in rss) <= limit_bytes:
            return None
        measure, per = "resident memory", rss
        if psutil.LINUX:  # PSS comes from /proc/PID/smaps_rollup
            measure, per = "memory (PSS)", sizes(tree, lambda p: p.memory_full_info().pss)
        total = sum(size for size, _ in per)
        if total <= limit_bytes:
            return None
        largest = ", ".join(f"pid {pid} {size / 2**30:.1f} GiB" for size, pid in sorted(per, reverse=True)[:3])
        return (f"{measure} of the driver and its workers reached {total / 2**30:.1f} GiB, over the "
                f"{limit_bytes / 2**30:.1f} GiB limit (--workerstart-memory-limit); largest: {largest}")

    return guard


@contextlib.contextmanager
def deadline(step: str, seconds: float | None, on_expiry: Callable[[], str] | None = None,
             guard: Callable[[], str | None] | None = None,
             overdue: Callable[[], str | None] | None = None) -> Iterator[None]:
    """``guard`` and ``overdue`` are polled every ``GUARD_EVERY_S``: a message from ``guard``
    stops the step as :class:`MemoryExceeded`, one from ``overdue`` as :class:`StepOverdue`."""
    polled = [g for g in (guard, overdue) if g is not None]
    if (seconds is None and not polled) or threading.current_thread() is not threading.main_thread():
        yield
        return
    details: list[str] = []
    abort: list[StepAborted] = []
    done = threading.Event()
    main = threading.main_thread().ident

    def handler(signum, frame):
        if abort and not done.is_set():
            done.set()
            raise abort[0]

    def stop(make: Callable[[str], StepAborted]) -> None:
        if on_expiry is not None:
            try:
                details.append(on_expiry())
            except Exception as exc:
                details.append(f"(could not gather stacks: {exc!r})")
        abort.append(make("".join(details)))
        while not done.is_set():  # a handler can be delayed by C code; keep knocking
            signal.pthread_kill(main, SIGNAL)
            done.wait(1.0)

    def watch():
        end = None if seconds is None else time.monotonic() + seconds
        while True:
            wait = GUARD_EVERY_S if polled else end - time.monotonic()
            if end is not None:
                wait = min(wait, end - time.monotonic())
            if done.wait(max(wait, 0)):
                return
            message = guard() if guard is not None else None
            if message:
                return stop(lambda d, message=message: MemoryExceeded(step, f"{step}: {message}", d))
            late = overdue() if overdue is not None else None
            if late:
                return stop(lambda d, late=late: StepOverdue(step, f"{step}: {late}", d))
            if end is not None and time.monotonic() >= end:
                return stop(lambda d: StepTimeout(step, seconds, d))

    old = signal.signal(SIGNAL, handler)
    watcher = threading.Thread(target=watch, name="workerstart-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(SIGNAL, old)
    if abort:  # expired, yet the block returned: the exception was swallowed (raised in a __del__) or came late
        raise abort[0]


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
