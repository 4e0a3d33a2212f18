"""Fault plans: what goes wrong, at which worker.

A plan travels inside the instrumented Process object (it is pickled with it
under spawn and forkserver, inherited under fork), so child-side faults need no
cooperation from the loader. Worker ids are creation order modulo
``num_workers``: torch-style loaders build worker i as the i-th Process.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import threading
import time

PARENT_KINDS = ("start_error", "start_delay", "start_at", "start_gate", "interrupt")
CHILD_KINDS = ("child_exit", "child_hang", "child_kill")

#: Where a dying worker's death is placed, each reached by synchronisation, never by sleeping
#: (``None``: as soon as it has booted, wherever the driver then is):
#:
#: - ``in_start``: before its own ``start()`` returns (that call waits until the worker is dead);
#: - ``before_send``: as the driver begins its next put on a queue it made through the
#:   context, once the worker's ``start()`` returned (the worker waits for that put, which
#:   waits until the worker is dead): alive while the driver starts other workers;
#: - ``while_waiting``: once the driver, having put work on such a queue, first waits for a
#:   result on one (the worker waits for that ``get``, then dies): ``iter()`` is over.
#:
#: The last two need the loader to use the context's ``Queue`` (``multiprocessing.Queue``); a
#: state the loader never reaches is reported as such (``WorkerRecord.death_placed`` is False).
DEATH_STATES = ("in_start", "before_send", "while_waiting")
#: the most seconds a placement waits for the other side (a worker's boot, the driver's next put)
PLACEMENT_PATIENCE_S = 30.0


def position_to_worker(position: str | int, num_workers: int) -> int:
    if isinstance(position, int):
        return position
    return {"first": 0, "middle": num_workers // 2, "last": num_workers - 1}[position]


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    worker: int
    value: float = 0.0  # exit code for child_exit, seconds for start_delay, the most seconds start_gate waits
    generation: int | None = 0  # which iterator's workers (0 = the first); None = every
    path: str | None = None  # start_gate: the file whose creation opens the gate
    at: str | None = None  # child_exit, child_kill: one of DEATH_STATES (None: at boot)


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """An immutable set of faults. Build with the class methods and ``+``."""

    faults: tuple[Fault, ...] = ()

    def __add__(self, other: FaultPlan) -> FaultPlan:
        return FaultPlan(self.faults + other.faults)

    # --- parent side -------------------------------------------------------
    @classmethod
    def start_error(cls, worker: int, generation: int | None = 0) -> FaultPlan:
        """``Process.start()`` of ``worker`` raises ``OSError(EAGAIN)``."""
        return cls((Fault("start_error", worker, generation=generation),))

    @classmethod
    def start_delay(cls, delays: dict[int, float], generation: int | None = 0) -> FaultPlan:
        """``Process.start()`` of each worker sleeps first (adversarial timing)."""
        return cls(tuple(Fault("start_delay", w, d, generation) for w, d in delays.items()))

    @classmethod
    def start_schedule(cls, order: tuple[int, ...], step: float) -> FaultPlan:
        """``start()`` of the worker ranked r in ``order`` begins ``r x step`` seconds after its
        iterator's first start began (at once if that time has passed), for every iterator:
        slots on one clock, so which start finishes first does not depend on how the loader
        hands starts to its threads, only on the slots and on which starts it holds back."""
        return cls(tuple(Fault("start_at", w, rank * step, None) for rank, w in enumerate(order)))

    @classmethod
    def start_gate(cls, worker: int, path: str, patience: float = 60.0) -> FaultPlan:
        """``Process.start()`` of ``worker`` waits until ``path`` exists (at most ``patience`` s):
        a test opens the gate when it has seen what it needed while that start was held."""
        return cls((Fault("start_gate", worker, patience, 0, path),))

    @classmethod
    def reverse_finish(cls, num_workers: int, step: float = 0.4) -> FaultPlan:
        """Delays that make worker N-1 finish starting first and worker 0 last."""
        return cls.start_delay({w: (num_workers - 1 - w) * step for w in range(num_workers)})

    @classmethod
    def interrupt(cls, worker: int) -> FaultPlan:
        """SIGINT to the driver's main thread as ``worker`` begins to start."""
        return cls((Fault("interrupt", worker),))

    # --- child side (during boot, before the worker loop) ------------------
    @classmethod
    def child_exit(cls, worker: int, code: int = 3, at: str | None = None) -> FaultPlan:
        """``worker`` exits with ``code`` after boot, its death placed ``at`` a state of :data:`DEATH_STATES`."""
        return cls((Fault("child_exit", worker, code, at=_state(at)),))

    @classmethod
    def child_hang(cls, worker: int) -> FaultPlan:
        return cls((Fault("child_hang", worker),))

    @classmethod
    def child_kill(cls, worker: int, at: str | None = None) -> FaultPlan:
        """``worker`` SIGKILLs itself after boot, its death placed ``at`` a state of :data:`DEATH_STATES`."""
        return cls((Fault("child_kill", worker, at=_state(at)),))

    # --- helpers -----------------------------------------------------------
    def for_worker(self, worker: int, generation: int) -> list[Fault]:
        return [f for f in self.faults if f.worker == worker and f.generation in (None, generation)]

    @staticmethod
    def worker_init_fn(worker: int, once_path: str | None = None) -> RaiseInWorkerInit:
        """A picklable ``worker_init_fn`` that raises in ``worker`` only.

        With ``once_path`` it raises only the first time (it creates that file),
        so a later ``iter()`` can succeed."""
        return RaiseInWorkerInit(worker, once_path)

    def deaths_at(self, *states: str) -> list[Fault]:
        """The child faults whose death is placed at one of ``states``."""
        return [f for f in self.faults if f.at in states]

    def describe(self) -> str:
        return ", ".join(f"{f.kind}@{f.worker}" + (f"={f.value}" if f.value else "") + (f"@{f.at}" if f.at else "")
                         for f in self.faults) or "none"


def _state(at: str | None) -> str | None:
    if at is not None and at not in DEATH_STATES:
        raise ValueError(f"unknown death state {at!r}: expected one of {', '.join(DEATH_STATES)}")
    return at


def is_dead(pid: int) -> bool:
    """The process has exited as its parent sees it, checked without reaping it (the
    loader's own wait must still find it): waitable, for a child of this process (a
    thread-group leader shows as a zombie before its last thread is gone, and only then is
    its parent told); reaped, for one another process forked (a forkserver's)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return not os.path.exists(f"/proc/{pid}")


def _sigchld_pending() -> bool:
    """A SIGCHLD sent to this process that no thread has taken yet (``ShdPnd``)."""
    try:
        with open("/proc/self/status") as f:
            pending = next((int(line.split()[1], 16) for line in f if line.startswith("ShdPnd:")), 0)
    except (OSError, ValueError):
        return False
    return bool(pending & (1 << (signal.SIGCHLD - 1)))


def place_death(record, patience: float = PLACEMENT_PATIENCE_S) -> None:
    """Wait until ``record``'s worker has exited, at most ``patience`` s, and then until the
    SIGCHLD it sent (to a driver that forked it) was taken, so a loader's SIGCHLD handler
    runs as the death is placed, not at some later step: the kernel may hand the signal to a
    thread that runs only later. ``record.death_placed`` says whether it died, also when that
    handler raises during the wait."""
    deadline = time.monotonic() + patience
    try:
        while not is_dead(record.pid) or _sigchld_pending():
            if time.monotonic() >= deadline:
                break
            time.sleep(0.002)
        time.sleep(0.002)  # in the main thread: a Python-level handler runs at this loop's end
    finally:
        record.death_placed = is_dead(record.pid)


def wait_for_file(path: str, patience: float = PLACEMENT_PATIENCE_S) -> bool:
    """Whether ``path`` exists within ``patience`` seconds (the gates' files)."""
    deadline = time.monotonic() + patience
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class InjectedStartError(OSError):
    """The parent-side start failure (an ``OSError`` with ``errno.EAGAIN``)."""


class InjectedWorkerInitError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class RaiseInWorkerInit:
    worker: int
    once_path: str | None = None

    def __call__(self, worker_id: int) -> None:
        if worker_id != self.worker:
            return
        if self.once_path is not None:
            try:
                os.close(os.open(self.once_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                return
        raise InjectedWorkerInitError(f"injected by workerstart: worker_init_fn of worker {worker_id}")


def apply_parent_fault(fault: Fault, first_begin: float | None = None) -> None:
    """Runs in the parent just before the real ``start()`` (``first_begin``: when the first
    start of this worker's iterator began, on the monotonic clock)."""
    if fault.kind == "start_error":
        raise InjectedStartError(errno.EAGAIN, f"injected by workerstart: start() of worker {fault.worker}")
    if fault.kind == "start_delay":
        time.sleep(fault.value)
    elif fault.kind == "start_at":
        time.sleep(max(0.0, (first_begin or time.monotonic()) + fault.value - time.monotonic()))
    elif fault.kind == "start_gate":
        wait_for_file(fault.path, fault.value)
    elif fault.kind == "interrupt":
        # To the main thread, as a terminal's Ctrl-C reaches it. Not os.kill(getpid()):
        # Linux hands a process-directed signal to the sending thread when it can, so
        # from a start thread the main thread, blocked in a wait, was not interrupted
        # and could miss the KeyboardInterrupt entirely (seen under load: "expected
        # KeyboardInterrupt, got nothing").
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.5)  # let the handler run here, as it would mid-start


def apply_child_fault(fault: Fault) -> None:
    """Runs in the child after boot, before the worker's target."""
    if fault.kind == "child_exit":
        os._exit(int(fault.value) or 3)
    if fault.kind == "child_kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    if fault.kind == "child_hang":
        while True:
            time.sleep(3600)


def exception_chain(exc: BaseException | None):
    """``exc`` and the errors it surfaces, as a user sees them in the traceback.

    An error surfaces the original through ``__cause__`` (``raise ... from e``),
    or through ``__context__`` unless that is suppressed: ``raise ... from None``
    hides the original from the user, so it does not count.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)


def describe_chain(exc: BaseException | None) -> list[str]:
    """``Type: message`` for each exception of ``exc``'s chain (for JSON reports)."""
    return [f"{type(e).__name__}: {e}"[:600] for e in exception_chain(exc)]
