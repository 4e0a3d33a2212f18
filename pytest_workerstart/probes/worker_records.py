"""What the instrumented context records of each worker start, in worker-id terms: construction,
``start()`` begin, hold release and end, pid, the forking process, boot, readiness, exit code."""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref


@dataclasses.dataclass
class WorkerRecord:
    worker: int
    generation: int
    constructed: float | None = None
    start_begin: float | None = None
    #: when the context's hold (``hold_for_overlap``) let the start proceed
    start_released: float | None = None
    start_end: float | None = None
    start_error: str | None = None
    pid: int | None = None
    #: the process that forked the worker, as the worker saw it at boot
    ppid: int | None = None
    boot: float | None = None
    ready: float | None = None
    exitcode: int | None = None
    #: when the worker's target returned or raised (None: it has not, or a signal ended it)
    exited: float | None = None
    #: a death placed at a state (faults.DEATH_STATES): whether the state was reached (None: no such fault)
    death_placed: bool | None = None
    #: when a worker that waited for its state (``while_waiting``) found it reached
    death_placed_at: float | None = None

    @property
    def start_duration_unheld(self) -> float | None:
        """The start's own duration, without the context's hold."""
        if self.start_released is None or self.start_end is None:
            return None
        return self.start_end - self.start_released


class Recorder:
    """Thread-safe parent-side bookkeeping shared by one context's processes."""

    def __init__(self, num_workers: int, hold: float | None):
        self.num_workers = num_workers
        self.hold = hold
        self.cond = threading.Condition()
        self.generation = 0
        self.index = 0
        self.records: dict[tuple[int, int], WorkerRecord] = {}
        self.procs: dict[tuple[int, int], weakref.ref] = {}
        self.active: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.started: dict[int, int] = {}

    def construct(self, proc) -> tuple[int, int]:
        with self.cond:
            if self.index >= self.num_workers:
                self.generation += 1
                self.index = 0
            key = (self.generation, self.index)
            self.index += 1
            self.records[key] = WorkerRecord(worker=key[1], generation=key[0], constructed=time.monotonic())
            self.procs[key] = weakref.ref(proc)
            return key

    def first_begin(self, gen: int) -> float | None:
        """When the first start of generation ``gen`` began (None: none has)."""
        with self.cond:
            begun = [r.start_begin for (g, _), r in self.records.items() if g == gen and r.start_begin is not None]
        return min(begun, default=None)

    def begin(self, key: tuple[int, int]) -> None:
        gen = key[0]
        with self.cond:
            self.records[key].start_begin = time.monotonic()
            self.active[gen] = self.active.get(gen, 0) + 1
            self.peak[gen] = max(self.peak.get(gen, 0), self.active[gen])
            self.cond.notify_all()
            if self.hold:
                # Hold every start until all remaining starts of this generation
                # are in flight or ``hold`` passes: overlap is then observed, and
                # a bounded pool shows exactly its bound.
                deadline = time.monotonic() + self.hold
                while self.active[gen] + self.started.get(gen, 0) < self.num_workers:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            self.records[key].start_released = time.monotonic()

    def end(self, key: tuple[int, int], pid: int | None, error: BaseException | None) -> None:
        gen = key[0]
        with self.cond:
            rec = self.records[key]
            rec.start_end = time.monotonic()
            rec.pid = pid
            rec.start_error = repr(error) if error is not None else None
            self.active[gen] -= 1
            self.started[gen] = self.started.get(gen, 0) + 1
            self.cond.notify_all()
