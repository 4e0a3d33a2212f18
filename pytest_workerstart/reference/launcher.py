"""Starting workers: in id order, serially (torch's way) or at most ``parallelism`` at once in
threads; and stopping what a failed start had started."""

from __future__ import annotations

import threading
import time

from pytest_workerstart import _torch_internals as torch_internals
from pytest_workerstart.reference import driverwatch
from pytest_workerstart.reference.errors import WorkerStartError

#: how long shutdown waits for a closed index queue's feeder thread to flush and end
FEEDER_JOIN_S = 1.0


def worker_main(token, loop_kwargs) -> None:
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
LIVE_IPC: dict[int, tuple] = {}


class Launcher:
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

    def begin(self) -> Launcher:
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


def start_serially(workers) -> None:
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


def join_feeders(queues) -> None:
    """Wait for the feeder threads of closed queues. A feeder still running when the
    interpreter exits releases its queue's semaphores as a daemon thread: killed
    mid-finalizer, it leaves a name unlinked but registered (the resource tracker
    warns of a leaked semaphore) or not unlinked at all (a leak)."""
    deadline = time.monotonic() + FEEDER_JOIN_S
    for q in queues:
        feeder = getattr(q, "_thread", None)  # multiprocessing.Queue's; None: it never sent
        if feeder is not None:
            feeder.join(max(0.0, deadline - time.monotonic()))


def stop_launches(launches, done_event) -> None:
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
    join_feeders(q for q, _ in launches)
