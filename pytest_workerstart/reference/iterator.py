"""The iterators: the multiprocessing one (deferred parallel start, failure handling) and
the single-process one, both counting delivered batches for ``state_dict()``."""

from __future__ import annotations

import queue
import re
import time
from typing import Any

import torch

from pytest_workerstart import _torch_internals as torch_internals
from pytest_workerstart.reference import driverwatch, private_forkserver
from pytest_workerstart.reference.errors import (
    WorkerFailedError,
    WorkerStartError,
    bare_copy,
    is_worker_failure,
    killed_by_signal,
)
from pytest_workerstart.reference.launcher import LIVE_IPC, Launcher, join_feeders
from pytest_workerstart.reference.policy import StartPolicy

#: how long a worker torch reported dead may take to be reaped, so its exit code (the signal) is known
EXIT_CODE_PATIENCE_S = 2.0
#: under forkserver, how often a wait for data checks that every worker is alive (torch: every
#: 5 s). A forkserver's workers are not the driver's children: no SIGCHLD reports their death.
LIVENESS_POLL_S = 0.25


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


class _ParallelStartIter(torch_internals.MultiProcessingIter):
    """Every decision about the workers is its policy's (:class:`StartPolicy`): these
    methods carry them out, and are not an extension point."""

    _ws_progress: _Progress | None = None
    _policy: StartPolicy | None = None

    def __init__(self, loader) -> None:  # a ParallelStartDataLoader
        torch_internals.BaseIter.__init__(self, loader)
        self._policy = policy = loader.start_policy(loader)
        self._timeout = policy.timeout(self._timeout)
        self._prefetch_factor = policy.prefetch_factor(loader.prefetch_factor)
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
        self._pending: Launcher | None = None
        self._launches: list | None = None
        parallelism = policy.parallelism(method, self._num_workers)
        self._server = loader._private_server(method)
        # what every worker is sent, by the keyword that set it (to name one that does not pickle)
        self._sent = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
                      "worker_init_fn": loader.worker_init_fn}
        self._method = method
        try:
            self._launch(ctx, parallelism)
        except BaseException as exc:
            policy.explain_start_error(exc, self._sent, self._method)
            self._abandon()
            policy.forget(exc)  # _launch's frame has finished by now: drop its locals too
            raise
        LIVE_IPC[id(self)] = (list(self._index_queues), self._worker_result_queue, self._workers_done_event)
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
                self._watch_workers()
                policy.started(self._workers)
        except RuntimeError as exc:  # a worker died while we primed it
            if not is_worker_failure(exc):
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
        if self._policy is None:  # BaseIter.__init__ failed: torch's __del__ still calls this
            return self._stop_workers()
        self._policy.shutdown(self._stop_workers)

    def _stop_workers(self) -> None:
        # A worker that already died makes torch's SIGCHLD handler raise again
        # when a healthy worker exits below, aborting the shutdown before the
        # queues are closed. Stop listening first; joins still have timeouts.
        if not self._shutdown:
            torch_internals.unregister_worker_pids(self)
        self._halt_starts()
        try:
            super()._shutdown_workers()  # closes the index queues without waiting for their feeders
        finally:
            shared = LIVE_IPC.pop(id(self), None)
            if shared is not None:  # every index queue primed, also those _halt_starts closed and dropped
                join_feeders(shared[0])
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
            self._watch_workers()  # raises if a worker already died
            self._policy.started(self._workers)
            return
        # The building state's cleanup, so a failed start is handled in one place.
        launches, procs = self._launches, launch.workers
        launch = self._launches = None
        self._policy.cleanup_failed_start(launches, self._workers_done_event, failure)  # workers, index queues
        self._workers, self._index_queues, self._workers_status = [], [], []
        self._fail()  # the shared result queue, pin-memory thread, pid registration
        self._policy.explain_start_error(failure, self._sent, self._method)
        try:
            raise failure
        finally:
            self._policy.forget(failure, launches, procs)
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
        return self._policy.receive(self._wait_for_data, timeout)

    def _wait_for_data(self, timeout):
        if not self._policy.watches_workers():
            try:
                return True, self._data_queue.get(timeout=timeout)
            except queue.Empty:
                return False, None
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

    def _process_data(self, data, worker_idx):
        return self._policy.received(super()._process_data(data, worker_idx))

    def _watch_workers(self) -> None:
        """Register the workers' pids with torch's SIGCHLD handler (raises if one already died)."""
        if self._policy.watches_workers():
            torch_internals.register_worker_pids(self)

    def _launch(self, ctx, parallelism: int) -> None:
        """Build every worker, then start them as the policy says (serially, or a deferred start)."""
        launches: list = []
        procs: list = []
        policy = self._policy
        try:
            self._build(ctx, launches)
            self._boot_from_server(launches)
            procs.extend(w for _, w in launches)
            self._pending = policy.start(procs, parallelism, self._server is not None)
            if self._pending is not None:
                self._launches = launches  # for _settle's cleanup if a deferred start fails
                self._pending.begin()
        except BaseException as exc:
            if self._pending is not None:
                self._pending.halt()
                self._pending = None
            policy.cleanup_failed_start(launches, self._workers_done_event, exc)
            policy.forget(exc, launches, procs)
            raise
        order = policy.registration_order(len(launches))
        self._index_queues = [launches[i][0] for i in order]
        self._workers = [launches[i][1] for i in order]

    def _boot_from_server(self, launches: list) -> None:
        """Workers not started yet boot from the private forkserver, if one is in use."""
        if self._server is not None:
            for _, w in launches:
                if w._popen is None:
                    private_forkserver.redirect(w)

    def _build(self, ctx, launches: list) -> None:
        """Append a (index queue, Process) pair per worker, in worker-id order."""
        token = driverwatch.driver_token()
        policy = self._policy
        for i in range(self._num_workers):
            q = ctx.Queue()
            q.cancel_join_thread()  # the driver never waits on what it sent
            kwargs = policy.worker_kwargs(i, torch_internals.worker_loop_kwargs(self, i, q))
            w = ctx.Process(target=policy.worker_main, args=(token, kwargs), daemon=True)
            launches.append((q, w))
            policy.built(i, w)

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
        except StopIteration:
            raise
        except WorkerStartError as exc:
            self._policy.failed(exc, self)
            # _settle cleaned up already; when it raised from inside torch's _next_data
            # (waiting for data), that frame's locals hold a received batch: drop them
            self._policy.forget(exc)
            raise
        except RuntimeError as exc:
            self._policy.failed(exc, self)
            if not is_worker_failure(exc):
                if self._pending is not None:
                    self._fail()
                raise
            message, silent = self._describe_failure(str(exc))
            cause = bare_copy(exc.__cause__)
        except BaseException as exc:
            self._policy.failed(exc, self)
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
                text = killed_by_signal(w.pid, -code)
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
