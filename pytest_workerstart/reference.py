"""The reference parallel-start loader: a drop-in ``torch.utils.data.DataLoader``.

``ParallelStartDataLoader(..., worker_start_parallelism=p)`` builds every worker
process and queue first, then starts them in worker-id order with at most
``min(p, num_workers)`` starts in flight (spawn and forkserver; fork stays
serial because forking from a process with start threads is unsafe). With
p > 1 the start is deferred: ``iter()`` returns while the starts run, and
``next()`` waits only for the worker the next batch needs. Workers are
registered in worker-id order whatever order the starts finish in, so seeds,
sharding and batch order are exactly torch's.

Under forkserver the workers are forked from the loader's own preloaded server
(:mod:`pytest_workerstart.private_forkserver`; ``private_forkserver=False``
opts out), and workers from id p on start once the first batch has arrived.

The iterator's states, and what each failure does (one method per cell):

============  =====================================  ==========================================
state         entered / left                         on a failure
============  =====================================  ==========================================
building      ``__init__`` / every Process and        ``_cleanup_failed_start`` stops what was
              queue exists                           started and closes every queue;
                                                     ``_abandon`` releases the shared queue
starting      p > 1: ``_Launcher.begin`` / ``_settle``  failed start (``_settle``): the building
              sees every start returned              cleanup, then ``_fail``; Ctrl-C or a dead
                                                     worker: ``_fail`` (``_halt_starts`` first)
running       pids registered with torch's SIGCHLD   a dead or silent worker: ``_fail``
              handler / exhaustion or shutdown
closed        ``_shutdown_workers`` or ``_fail``     (nothing left)
============  =====================================  ==========================================

Every raised error leaves through ``_forget``, which drops what its traceback
would keep alive.

On any start failure every started process is stopped and joined, every queue
closed, every start thread joined, and the references a raised exception would
otherwise keep alive (through traceback frames) are dropped, so nothing leaks
even while the exception is held. Workers also exit when the *driving* process
dies (see :mod:`pytest_workerstart.driverwatch`), in every context.
"""

from __future__ import annotations

import functools
import pickle
import queue
import re
import sys
import threading
import time
import traceback
import warnings
from typing import Any, TypeVar

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader

from pytest_workerstart import _torch_internals as torch_internals
from pytest_workerstart import driverwatch, private_forkserver
from pytest_workerstart.cores import usable_cores

__all__ = ["ParallelStartDataLoader", "WorkerStartError", "WorkerFailedError", "preload_forkserver", "usable_cores"]


#: how long a worker torch reported dead may take to be reaped, so its exit code (the signal) is known
EXIT_CODE_PATIENCE_S = 2.0
#: under forkserver, how often a wait for data checks that every worker is alive (torch: every
#: 5 s). A forkserver's workers are not the driver's children: no SIGCHLD reports their death.
LIVENESS_POLL_S = 0.25
#: how long shutdown waits for a closed index queue's feeder thread to flush and end
FEEDER_JOIN_S = 1.0


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


def _name_unpicklable(err: BaseException, arguments: dict, method: str) -> None:
    """Reword a start error caused by an argument that does not pickle, naming it."""
    cause = err.__cause__ if isinstance(err, WorkerStartError) else None
    if cause is None or not _is_pickling_error(cause):
        return
    name = _unpicklable_argument(arguments)
    if name is not None:
        err.args = (err.describe(cause, f"{name} cannot be pickled, and the {method!r} start method sends it to "
                                        "every worker (define it at module level: lambdas and local functions "
                                        "do not pickle; or use 'fork')"),)


def _killed_by_signal(pid: int, signum: int) -> str:
    """torch's own wording for a worker a signal killed (its SIGCHLD handler's message)."""
    import signal

    try:
        name = signal.strsignal(signum) or f"signal {signum}"
    except ValueError:
        name = f"signal {signum}"
    return f"DataLoader worker (pid {pid}) is killed by signal: {name}."


def _is_worker_failure(exc: BaseException) -> bool:
    text = str(exc)
    return text.startswith("DataLoader worker") or text.startswith("DataLoader timed out")


def _validate_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def _validate_preload(value) -> tuple[str, ...]:
    try:
        names = None if isinstance(value, str) else tuple(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(v, str) and v for v in names):
        raise TypeError(f"preload must be a list of module names, got {value!r}")
    return names


def _modules_of(*objs) -> list[str]:
    """Modules a worker imports to unpickle ``objs`` (``__main__`` is left to the server's
    own preparation, which imports it as a worker would, as ``__mp_main__``)."""
    out = []
    for obj in objs:
        if obj is None:
            continue
        obj = getattr(obj, "func", obj)  # functools.partial
        mod = getattr(obj, "__module__", None) if callable(obj) and not isinstance(obj, type) else None
        mod = mod or type(obj).__module__
        if isinstance(mod, str) and mod not in ("__main__", "builtins"):
            out.append(mod)
    return out


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _validate_parallelism(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"worker_start_parallelism must be an int >= 1, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"worker_start_parallelism must be an int >= 1, got {value!r}")
    return value


def _scrub(exc: BaseException | None, seen: set[int] | None = None) -> None:
    """Drop the locals of finished frames in ``exc``'s tracebacks (and its chain).

    A held exception (``pytest.raises``, logging) otherwise keeps the half-built
    iterator's processes, queues, fds and semaphores alive through those frames.
    """
    seen = seen if seen is not None else set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        _scrub(exc.__context__, seen)
        exc = exc.__cause__


def preload_forkserver(*modules: str, dataset=None) -> list[str]:
    """Have the forkserver import ``torch`` (plus ``modules`` and ``dataset``'s
    module) once, so forkserver workers fork with it already imported.

    Call it before the first forkserver worker of the process; it cannot change
    a server that is already running (a ``RuntimeWarning`` says so). Trade-offs:
    workers boot in a fork plus an unpickle instead of a full torch import, and
    share the imported pages copy-on-write (less PSS); but whatever those imports
    do at import time happens in the server, and a module imported there is not
    re-imported per worker (edits to it need a new process). ``__main__`` is
    deliberately not preloaded (its preload differs across Python versions,
    cpython#126631). Returns the list it set.
    """
    import multiprocessing
    import warnings
    from multiprocessing import forkserver

    names = ["torch", *modules]
    if dataset is not None:
        mod = type(dataset).__module__
        if mod and mod != "__main__":
            names.append(mod)
    names = list(dict.fromkeys(names))
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
        warnings.warn("preload_forkserver: the forkserver is already running; its preload list is unchanged",
                      RuntimeWarning, stacklevel=2)
    multiprocessing.get_context("forkserver").set_forkserver_preload(names)
    return names


#: The item type, as torch's DataLoader is generic in it (``ParallelStartDataLoader[Batch]``).
T_co = TypeVar("T_co", covariant=True)


class ParallelStartDataLoader(DataLoader[T_co]):
    """``torch.utils.data.DataLoader`` plus ``worker_start_parallelism``.

    ``worker_start_parallelism`` (int >= 1, default 1): how many worker starts may
    be in flight at once under spawn and forkserver; capped at ``num_workers``;
    1 starts workers one by one; ignored (serial) under fork.

    ``private_forkserver`` (bool, default True): under forkserver, fork workers from
    the loader's own server, which has imported torch, the main module and the
    modules of what workers are sent (docs/reference.md); False: multiprocessing's.
    ``preload`` (module names): more modules that server imports once.

    ``state_dict()`` / ``load_state_dict()``: resume an epoch of a map-style dataset
    where it stopped, in a new loader built with the same arguments (the generator's
    state is saved and restored, so a seeded shuffle resumes the same permutation).
    """

    __workerstart_capabilities__ = {"parallel_start": ("spawn", "forkserver")}
    __workerstart_parallelism_kwarg__ = "worker_start_parallelism"
    # resume: batches the next iterator skips; the current epoch's progress
    _resume_skip = 0
    _progress: _Progress | None = None
    _index_sampler = torch_internals.resumable_index_sampler("_resume_skip")

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
        worker_start_parallelism: int = 1,
        private_forkserver: bool = True,
        preload=(),
    ) -> None:
        self.worker_start_parallelism = _validate_parallelism(worker_start_parallelism)
        self.private_forkserver = _validate_flag("private_forkserver", private_forkserver)
        self.preload = _validate_preload(preload)
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        # Boot the server now, in the background: its torch import overlaps whatever the
        # caller does before iter(). Only for an explicit forkserver context: asking the
        # default context its method would fix the process's start method.
        ctx = self.multiprocessing_context
        if self.num_workers > 0 and ctx is not None and ctx.get_start_method() == "forkserver":
            self._private_server("forkserver")

    def _private_server(self, method: str):
        """The private forkserver this loader's workers boot from under ``method``, or None."""
        if method != "forkserver" or not self.private_forkserver:
            return None
        why = private_forkserver.unsupported()
        if why is not None:
            _warn_once(f"ParallelStartDataLoader: {why}; workers boot from multiprocessing's forkserver")
            return None
        implicit = _modules_of(self.dataset, self.collate_fn, self.worker_init_fn, self.multiprocessing_context)
        return private_forkserver.server_for(implicit, self.preload)

    def __iter__(self):
        # counted by the iterator itself, so the count outlives it (``for ... break`` drops it)
        progress = _Progress(self._resume_skip, self.generator.get_state() if self.generator is not None else None)
        try:
            it = super().__iter__()
        finally:
            self._resume_skip = 0
        it._ws_progress = self._progress = progress
        return it

    def state_dict(self) -> dict:
        """Where the current epoch stands: batches delivered (plus those a resume skipped)
        and the generator's state when the epoch began."""
        p = self._progress
        if p is None:
            return {"batches_yielded": 0, "generator_state": None}
        return {"batches_yielded": p.delivered, "generator_state": p.generator_state}

    def load_state_dict(self, state: dict) -> None:
        """The next ``iter()`` resumes the epoch ``state`` (from :meth:`state_dict`) describes."""
        try:
            skip, gen_state = int(state["batches_yielded"]), state["generator_state"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"load_state_dict: expected a dict from state_dict(), got {state!r}") from None
        if skip < 0:
            raise ValueError(f"load_state_dict: batches_yielded must be >= 0, got {skip}")
        if skip and isinstance(self.dataset, torch.utils.data.IterableDataset):
            raise ValueError("load_state_dict: an IterableDataset's position is the dataset's own state; "
                             "this loader resumes map-style datasets only")
        if gen_state is not None and self.generator is not None:
            self.generator.set_state(gen_state)
        self._resume_skip = skip

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleIter(self)
        _as_torchs_warning(self.check_worker_number_rationality)
        return self._iterator_class(self)


def _bare_copy(exc: BaseException | None) -> BaseException | None:
    """``exc`` without its traceback (whose frames would keep the dead iterator's workers
    and queues referenced for as long as the error is), or None."""
    if exc is None:
        return None
    try:
        return type(exc)(*exc.args)
    except Exception:
        return RuntimeError(str(exc))


def _as_torchs_warning(check) -> None:
    """Run one of torch's checks so that what it warns is attributed to torch's DataLoader
    module, as when torch's own ``_get_iterator`` calls it: a user's filter by module
    (``ignore::UserWarning:torch.utils.data.dataloader``) and torch's once-per-location
    registry then treat it alike."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check()
    module = sys.modules[DataLoader.__module__]
    filename, lineno = _torch_call_site(check.__name__)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, filename, lineno, module=module.__name__,
                               registry=module.__dict__.setdefault("__warningregistry__", {}))


@functools.cache
def _torch_call_site(name: str) -> tuple[str, int]:
    """Where torch's ``DataLoader._get_iterator`` calls ``name`` (its first line if the source is not there)."""
    import inspect

    code = DataLoader._get_iterator.__code__
    try:
        lines, first = inspect.getsourcelines(DataLoader._get_iterator)
    except (OSError, TypeError):
        return code.co_filename, code.co_firstlineno
    return code.co_filename, next((first + k for k, line in enumerate(lines) if name in line), first)


class _Progress:
    """An epoch's position: batches a resume skipped plus batches delivered since."""

    def __init__(self, skipped: int, generator_state):
        self.delivered, self.generator_state = skipped, generator_state


class _SingleIter(torch_internals.SingleProcessIter):
    _ws_progress: _Progress | None = None

    def __next__(self):
        batch = super().__next__()
        if self._ws_progress is not None:
            self._ws_progress.delivered += 1
        return batch


def _worker_main(token, loop_kwargs) -> None:
    """Worker process entry: watch the driver, then run torch's worker loop."""
    driverwatch.watch_driver(token)
    torch_internals.run_worker_loop(loop_kwargs)


#: What live iterators share with their workers (index queues, result queue, done
#: event), held outside any reference cycle until their shutdown returns.
#: Why: an iterator kept alive by a held exception dies in the cyclic gc, which
#: runs these objects' weakref finalizers *before* the iterator's ``__del__``:
#: the index queues' feeders stop before the ``None`` that tells workers to exit
#: is sent (every worker then waits out torch's 5 s join: stock torch, 15 s for 3
#: workers), and the semaphores are unlinked while a spawn worker still booting has
#: yet to unpickle them (it dies with ``FileNotFoundError`` on stderr). Held here,
#: they are not garbage in that pass.
_LIVE_IPC: dict[int, tuple] = {}


class _Launcher:
    """Starts ``workers`` in id order, at most ``parallelism`` at once, in threads.

    After the first failure no new start begins; in-flight ones finish.
    ``first_batch_first``: workers from id ``parallelism`` on wait until
    :meth:`open_gate` (the first batch arrived), so the workers that compute the
    first batches do not share the CPU with the rest: worth it only where a start
    is cheap (a fork from the private forkserver), not where each is a boot.
    Plain threads, not a
    ThreadPoolExecutor: a KeyboardInterrupt inside ``submit`` can leave a pool
    thread that nothing joins; these are joined even after an interrupted
    ``Thread.start()``.
    """

    def __init__(self, workers: list, parallelism: int, first_batch_first: bool = False) -> None:
        self.workers = workers
        self.parallelism = min(parallelism, len(workers))
        self.errors: dict[int, BaseException] = {}
        self._stop = threading.Event()
        self._gate = threading.Event()
        if not first_batch_first:
            self._gate.set()
        self._next_id = iter(range(len(workers)))
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def open_gate(self) -> None:
        self._gate.set()

    def begin(self) -> _Launcher:
        for k in range(self.parallelism):
            t = threading.Thread(target=self._run, name=f"ParallelStartDataLoader-start-{k}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                i = next(self._next_id, None)
            if i is None:
                return
            if i >= self.parallelism:
                while not self._gate.wait(0.05):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
            try:
                self.workers[i].start()
            except BaseException as exc:
                self.errors[i] = exc
                self._stop.set()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def join(self) -> None:
        try:
            for t in self._threads:
                t.join()
        finally:
            self._stop.set()  # interrupted: no new starts; in-flight ones finish
            for t in self._threads:
                _join_started(t)
            self._threads.clear()

    def halt(self) -> None:
        self._stop.set()
        self._gate.set()
        self.join()

    def failure(self) -> WorkerStartError | BaseException | None:
        """The lowest failing worker's error (wrapped), or ``None``; forgets the rest."""
        if not self.errors:
            return None
        first = min(self.errors)
        exc = self.errors.pop(first)
        self.errors.clear()
        if not isinstance(exc, Exception):
            return exc
        err = WorkerStartError(first, len(self.workers), exc)
        err.__cause__ = exc
        return err


def _start_serially(workers) -> None:
    """torch's own start: one by one, in id order, before ``iter()`` returns."""
    for i, w in enumerate(workers):
        try:
            w.start()
        except Exception as exc:
            raise WorkerStartError(i, len(workers), exc) from exc


def _join_started(t: threading.Thread, patience: float = 1.0) -> None:
    """Join ``t`` even if an interrupted ``t.start()`` had not yet seen it run."""
    deadline = time.monotonic() + patience
    while True:
        try:
            t.join()
            return
        except RuntimeError:  # "cannot join thread before it is started"
            if time.monotonic() > deadline:
                return  # it never started
            time.sleep(0.01)


def _join_feeders(queues) -> None:
    """Wait for the feeder threads of closed queues. A feeder still running when the
    interpreter exits releases its queue's semaphores as a daemon thread: killed
    mid-finalizer, it leaves a name unlinked but registered (the resource tracker
    warns of a leaked semaphore) or not unlinked at all (a leak)."""
    deadline = time.monotonic() + FEEDER_JOIN_S
    for q in queues:
        feeder = getattr(q, "_thread", None)  # multiprocessing.Queue's; None: it never sent
        if feeder is not None:
            feeder.join(max(0.0, deadline - time.monotonic()))


def _stop_launches(launches, done_event) -> None:
    """Stop and join every started process and close every queue."""
    done_event.set()
    started = [(q, w) for q, w in launches if w._popen is not None]
    for _, w in started:
        if w.is_alive():
            w.terminate()
    for _, w in started:
        w.join(timeout=torch_internals.MP_STATUS_CHECK_INTERVAL)
        if w.is_alive():
            w.kill()
            w.join()
    for q, w in launches:
        q.cancel_join_thread()
        q.close()
        if w._popen is not None:
            w.close()
    _join_feeders(q for q, _ in launches)


class _ParallelStartIter(torch_internals.MultiProcessingIter):
    _ws_progress: _Progress | None = None

    def __init__(self, loader: ParallelStartDataLoader) -> None:
        torch_internals.BaseIter.__init__(self, loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        ctx = loader.multiprocessing_context or torch.multiprocessing
        method = ctx.get_start_method()
        self._worker_init_fn = torch_internals.worker_init_fn_for(self, loader)
        # Everything torch's shutdown path reads exists before anything can fail.
        self._worker_pids_set = False
        self._shutdown = False
        self._workers: list = []
        self._index_queues: list = []
        self._workers_status: list = []
        self._worker_result_queue = ctx.Queue()
        self._workers_done_event = ctx.Event()
        self._pending: _Launcher | None = None
        self._launches: list | None = None
        parallelism = self._effective_parallelism(loader, method)
        self._server = loader._private_server(method)
        # what every worker is sent, by the keyword that set it (to name one that does not pickle)
        self._sent = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
                      "worker_init_fn": loader.worker_init_fn}
        self._method = method
        try:
            self._launch(ctx, parallelism)
        except BaseException as exc:
            self._explain_start_error(exc)
            self._abandon()
            self._forget(exc)  # _launch's frame has finished by now: drop its locals too
            raise
        _LIVE_IPC[id(self)] = (list(self._index_queues), self._worker_result_queue, self._workers_done_event)
        try:
            if self._pin_memory:
                torch_internals.start_pin_memory_thread(self)
            else:
                self._data_queue = self._worker_result_queue
            if self._persistent_workers and self._pin_memory:
                self._register_persistent_workers_atexit()
            # Prime first, then listen for SIGCHLD: torch's handler raises
            # asynchronously, and inside Queue.put it can leave a feeder thread
            # that no close() reaches. A worker that died meanwhile is reported
            # synchronously by register_worker_pids. (Deferred starts register
            # once every start has returned: see _settle.)
            self._reset(loader, first_iter=True)
            if self._pending is None:
                torch_internals.register_worker_pids(self)
        except RuntimeError as exc:  # a worker died while we primed it
            if not _is_worker_failure(exc):
                if self._pending is not None:
                    self._fail()
                raise
            message, silent = self._describe_failure(str(exc))
        except BaseException:  # e.g. Ctrl-C while deferred starts run
            if self._pending is not None:
                self._fail()
            raise
        else:
            return
        self._fail(silent)
        raise WorkerFailedError(message)

    def _shutdown_workers(self) -> None:
        # A worker that already died makes torch's SIGCHLD handler raise again
        # when a healthy worker exits below, aborting the shutdown before the
        # queues are closed. Stop listening first; joins still have timeouts.
        if not self._shutdown:
            torch_internals.unregister_worker_pids(self)
        self._halt_starts()
        try:
            super()._shutdown_workers()  # closes the index queues without waiting for their feeders
        finally:
            shared = _LIVE_IPC.pop(id(self), None)
            if shared is not None:  # every index queue primed, also those _halt_starts closed and dropped
                _join_feeders(shared[0])
            if getattr(self, "_server", None) is not None:
                private_forkserver.reap_retired()  # a replaced server exits with its last worker

    # --- deferred start ------------------------------------------------------
    # With parallelism > 1, iter() builds every worker and queue, primes the
    # index queues and returns while the starts run in id order in background
    # threads; __next__ waits only for the data it needs. Batch k needs worker
    # k mod N, so the first batch arrives after one worker's boot instead of
    # after all N (the lowest ids start first). A failed start is raised, after
    # full cleanup, by the first __next__ that sees it, and at the latest by the
    # one that needs the failed worker.

    def _settle(self) -> None:
        """If the deferred starts are over: raise their failure, or register pids."""
        launch = self._pending
        if launch is None or not launch.done():
            return
        self._pending = None
        launch.join()
        failure = launch.failure()
        if failure is None:
            self._launches = None
            torch_internals.register_worker_pids(self)  # raises if a worker already died
            return
        # The building state's cleanup, so a failed start is handled in one place.
        launches, procs = self._launches, launch.workers
        launch = self._launches = None
        self._cleanup_failed_start(launches)  # stop started workers, close every index queue
        self._workers, self._index_queues, self._workers_status = [], [], []
        self._fail()  # the shared result queue, pin-memory thread, pid registration
        self._explain_start_error(failure)
        try:
            raise failure
        finally:
            self._forget(failure, launches, procs)
            failure = launches = procs = None

    def _halt_starts(self) -> None:
        """Stop deferred starts (in-flight ones finish); forget unstarted workers."""
        launch, self._pending = getattr(self, "_pending", None), None
        self._launches = None
        if launch is None:
            return
        launch.halt()
        launch.failure()  # shutting down anyway: drop the error and its frames
        # Close the queues of workers never started and forget them (torch joins all).
        keep = [i for i, w in enumerate(self._workers) if w._popen is not None]
        for i, q in enumerate(self._index_queues):
            if i not in keep:
                q.cancel_join_thread()
                q.close()
        status = list(self._workers_status) + [True] * (len(self._workers) - len(self._workers_status))
        self._workers = [self._workers[i] for i in keep]
        self._index_queues = [self._index_queues[i] for i in keep]
        self._workers_status = [status[i] for i in keep]

    def _try_get_data(self, timeout=torch_internals.MP_STATUS_CHECK_INTERVAL):
        if self._pending is None:
            if self._method != "forkserver":
                # the workers are children: torch's SIGCHLD handler names one that dies (with the
                # signal); a liveness check that reaped it first would take that report away
                return super()._try_get_data(timeout)
            # torch's wait in slices: its liveness check after each names a dead worker at once
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                got = super()._try_get_data(max(min(remaining, LIVENESS_POLL_S), 0.0))
                if got[0] or remaining <= LIVENESS_POLL_S:
                    return got
        owed = self._task_info.get(self._rcvd_idx)
        if owed and owed[0] >= self._pending.parallelism:
            self._pending.open_gate()  # the next batch is a gated worker's (e.g. the first ones' shards ran dry)
        deadline = time.monotonic() + timeout
        while True:
            self._settle()
            remaining = deadline - time.monotonic()
            if self._pending is None:
                return super()._try_get_data(max(remaining, 0.0))
            try:
                return True, self._data_queue.get(timeout=max(min(remaining, 0.05), 0.0))
            except queue.Empty:
                pass
            # torch's liveness check, for the workers started so far
            dead = [i for i, w in enumerate(self._workers)
                    if w._popen is not None and self._workers_status[i] and not w.is_alive()]
            if dead:
                for i in dead:
                    self._mark_worker_as_unavailable(i)
                pids = ", ".join(str(self._workers[i].pid) for i in dead)
                # torch's liveness check raises from the queue's Empty: the same chaining
                raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") from queue.Empty()
            if remaining <= 0:
                return False, None

    def _effective_parallelism(self, loader, method: str) -> int:
        # fork stays serial: forking while start threads run is unsafe.
        return 1 if method == "fork" else min(loader.worker_start_parallelism, self._num_workers)

    def _launch(self, ctx, parallelism: int) -> None:
        """Build every worker, then start serially (p = 1) or begin the deferred start."""
        launches: list = []
        procs: list = []
        try:
            self._build(ctx, launches)
            self._boot_from_server(launches)
            procs.extend(w for _, w in launches)
            if parallelism > 1:
                self._pending = self._launcher(procs, parallelism)
                self._launches = launches  # for _settle's cleanup if a deferred start fails
                self._pending.begin()
            else:
                _start_serially(procs)
        except BaseException as exc:
            if self._pending is not None:
                self._pending.halt()
                self._pending = None
            self._cleanup_failed_start(launches)
            self._forget(exc, launches, procs)
            raise
        self._register(launches)

    # Seams (one method per decision; the broken loaders in fixtures/ override one each).
    def _explain_start_error(self, exc: BaseException) -> None:
        _name_unpicklable(exc, self._sent, self._method)

    def _launcher(self, procs: list, parallelism: int) -> _Launcher:
        return _Launcher(procs, parallelism, first_batch_first=self._server is not None)

    def _cleanup_failed_start(self, launches: list) -> None:
        _stop_launches(launches, self._workers_done_event)

    def _forget(self, exc: BaseException, *lists: list) -> None:
        """Drop what a held ``exc`` would keep alive: frames and closures in its
        traceback still see these lists, so empty them, then clear frame locals."""
        for lst in lists:
            lst.clear()
        _scrub(exc)

    def _register(self, launches: list) -> None:
        """Worker-id order, whatever order the starts finish in."""
        self._index_queues = [q for q, _ in launches]
        self._workers = [w for _, w in launches]

    def _boot_from_server(self, launches: list) -> None:
        """Workers not started yet boot from the private forkserver, if one is in use."""
        if self._server is not None:
            for _, w in launches:
                if w._popen is None:
                    private_forkserver.redirect(w)

    def _worker_target(self):
        return _worker_main

    def _build(self, ctx, launches: list) -> None:
        """Append a (index queue, Process) pair per worker, in worker-id order."""
        token = driverwatch.driver_token()
        for i in range(self._num_workers):
            q = ctx.Queue()
            q.cancel_join_thread()  # the driver never waits on what it sent
            w = ctx.Process(target=self._worker_target(),
                            args=(token, torch_internals.worker_loop_kwargs(self, i, q)), daemon=True)
            launches.append((q, w))

    def _abandon(self) -> None:
        """After a failed start: release the shared queue/event; make __del__ a no-op."""
        self._shutdown = True
        self._workers_done_event.set()
        self._worker_result_queue.cancel_join_thread()
        self._worker_result_queue.close()
        self._worker_result_queue = self._workers_done_event = None
        self._workers, self._index_queues = [], []

    def __next__(self):
        # torch reports a dead or silent worker as a RuntimeError, from _get_data
        # or from its SIGCHLD handler at any point of __next__: turn it into a
        # clear error naming the worker, after shutting every worker down.
        try:
            self._settle()
            batch = super().__next__()
            if self._pending is not None:
                self._pending.open_gate()  # the first batch is here: start the rest
            if self._ws_progress is not None:
                self._ws_progress.delivered += 1
            return batch
        except WorkerStartError as exc:
            # _settle cleaned up already; when it raised from inside torch's _next_data
            # (waiting for data), that frame's locals hold a received batch: drop them
            self._forget(exc)
            raise
        except RuntimeError as exc:
            if not _is_worker_failure(exc):
                if self._pending is not None:
                    self._fail()
                raise
            message, silent = self._describe_failure(str(exc))
            cause = _bare_copy(exc.__cause__)
        except BaseException as exc:
            if not isinstance(exc, (Exception, GeneratorExit)):
                if self._pending is not None:  # Ctrl-C while starts run: stop them all now
                    self._fail()
            raise
        self._fail(silent)  # outside the except block: the RuntimeError is not kept as __context__
        if cause is None:
            raise WorkerFailedError(message)
        raise WorkerFailedError(message) from cause  # torch chains what it saw first, so do we

    def _describe_failure(self, text: str) -> tuple[str, Any]:
        """``text`` (torch's wording where torch has one), then which worker did what; and the
        worker that did not answer within the loader's timeout, if that was the failure."""
        names, silent = [], None
        listed = re.search(r"\(pid(?:\(s\))? ([\d, ]+)\)", text)
        named = {int(p) for p in re.findall(r"\d+", listed.group(1))} if listed else set()
        for worker_id, w in enumerate(self._workers):
            if w.pid in named and w.exitcode is None:
                w.join(EXIT_CODE_PATIENCE_S)  # dead but not yet reaped (a core dump still being written)
            code = w.exitcode
            if code is not None and code < 0 and "is killed by signal" not in text:
                text = _killed_by_signal(w.pid, -code)
            if code is not None:
                names.append(f"worker {worker_id} (pid {w.pid}) exited with code {code}")
        if not names and getattr(self, "_tasks_outstanding", 0):
            owed = self._task_info.get(self._rcvd_idx)
            if owed:
                w = self._workers[owed[0]]
                names.append(f"worker {owed[0]} (pid {w.pid}) did not answer")
                silent = w
        if not names:
            return text, silent
        return f"{text}{' ' if text.endswith('.') else ': '}" + "; ".join(names), silent

    def _fail(self, silent=None) -> None:
        """Shut every worker down and drop queue references (the iterator is dead).

        ``silent``: a worker that did not answer within the loader's timeout, terminated
        first: torch's shutdown would wait its 5 s join for the same silence."""
        if silent is not None and silent._popen is not None and silent.exitcode is None:
            silent.terminate()
        # Unregister first: otherwise the next SIGCHLD (a healthy worker exiting
        # during shutdown) re-raises the failure from inside _shutdown_workers,
        # aborting it before the queues are closed.
        torch_internals.unregister_worker_pids(self)
        self._shutdown_workers()
        for q in (self._worker_result_queue,):
            if q is not None:
                q.cancel_join_thread()
                q.close()
        for w in self._workers:
            if w._popen is not None and w.exitcode is not None:
                w.close()
        self._worker_result_queue = self._data_queue = self._workers_done_event = None
        self._workers, self._index_queues = [], []
        self._workers_status = []
        if hasattr(self, "_task_info"):
            self._task_info.clear()  # batches received out of order hold shm fds


ParallelStartDataLoader._iterator_class = _ParallelStartIter
