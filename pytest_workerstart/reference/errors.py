"""The reference loader's errors, and how a start failure is described and let go of."""

from __future__ import annotations

import pickle
import traceback

__all__ = ["WorkerStartError", "WorkerFailedError"]


class WorkerStartError(RuntimeError):
    """A worker process could not be started; ``__cause__`` is the original error."""

    def __init__(self, worker_id: int, num_workers: int, cause: BaseException):
        self.worker_id, self.num_workers = worker_id, num_workers
        super().__init__(self.describe(cause))

    def describe(self, cause: BaseException, why: str = "") -> str:
        """The message, optionally saying why ``cause`` happened."""
        return (f"DataLoader worker {self.worker_id} (of {self.num_workers}) failed to start: "
                f"{why + ': ' if why else ''}{type(cause).__name__}: {cause}")


class WorkerFailedError(RuntimeError):
    """A worker died, was killed or did not answer within ``timeout``."""


def _is_pickling_error(exc: BaseException) -> bool:
    # pickle raises PicklingError for lambdas at module level, AttributeError
    # ("Can't pickle local object") for local ones, TypeError for C objects
    return isinstance(exc, pickle.PicklingError) or (
        isinstance(exc, (AttributeError, TypeError)) and "pickle" in str(exc).lower())


def _unpicklable_argument(arguments: dict) -> str | None:
    """The first argument a worker is sent that does not pickle; the pickling error
    alone names only the object ("<function <lambda> at 0x...>"), not the argument."""
    from multiprocessing.reduction import ForkingPickler

    for name, value in arguments.items():
        try:
            ForkingPickler.dumps(value)
        except Exception as exc:
            if _is_pickling_error(exc):
                return name
    return None


def name_unpicklable_argument(err: BaseException, arguments: dict, method: str) -> None:
    """Reword a start error caused by an argument that does not pickle, naming it."""
    cause = err.__cause__ if isinstance(err, WorkerStartError) else None
    if cause is None or not _is_pickling_error(cause):
        return
    name = _unpicklable_argument(arguments)
    if name is not None:
        err.args = (err.describe(cause, f"{name} cannot be pickled, and the {method!r} start method sends it to "
                                        "every worker (define it at module level: lambdas and local functions "
                                        "do not pickle; or use 'fork')"),)


def killed_by_signal(pid: int, signum: int) -> str:
    """torch's own wording for a worker a signal killed (its SIGCHLD handler's message)."""
    import signal

    try:
        name = signal.strsignal(signum) or f"signal {signum}"
    except ValueError:
        name = f"signal {signum}"
    return f"DataLoader worker (pid {pid}) is killed by signal: {name}."


def is_worker_failure(exc: BaseException) -> bool:
    text = str(exc)
    return text.startswith("DataLoader worker") or text.startswith("DataLoader timed out")


def clear_held_frames(exc: BaseException | None, seen: set[int] | None = None) -> None:
    """Drop the locals of finished frames in ``exc``'s tracebacks (and its chain).

    A held exception (``pytest.raises``, logging) otherwise keeps the half-built
    iterator's processes, queues, fds and semaphores alive through those frames.
    """
    seen = seen if seen is not None else set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        clear_held_frames(exc.__context__, seen)
        exc = exc.__cause__


def bare_copy(exc: BaseException | None) -> BaseException | None:
    """``exc`` without its traceback (whose frames would keep the dead iterator's workers
    and queues referenced for as long as the error is), or None."""
    if exc is None:
        return None
    try:
        return type(exc)(*exc.args)
    except Exception:
        return RuntimeError(str(exc))
