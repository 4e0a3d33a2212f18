"""An instrumented multiprocessing context that any DataLoader accepts.

``InstrumentedContext("spawn")`` is a real ``BaseContext`` subclass whose
``get_start_method()`` is the wrapped method, so torch's ``isinstance`` check
passes and torchdata's ``== "spawn"`` test sees spawn. Its ``Process`` builds
instrumented subclasses of the wrapped context's own Process class, which record
(in worker-id terms) construction, ``start()`` begin/end, pid, child boot and
readiness, and apply a :class:`~pytest_workerstart.probes.faults.FaultPlan`.

Parent-side events are kept in memory; child-side events are appended as JSON
lines to a file whose path travels in the pickled Process. A file (not a queue)
keeps the probe out of the leak snapshot: no fd, thread or semaphore of its own.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.queues
import os
import shutil
import tempfile
import threading
import time
import weakref
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from pytest_workerstart.probes import faults as _faults
from pytest_workerstart.probes.shm import shm_entries_mapped_by
from pytest_workerstart.probes.worker_records import Recorder, WorkerRecord


class _InstrumentedProcessMixin:
    """Mixed into the wrapped context's Process class (see the three below)."""

    _ws_key: tuple[int, int] = (0, 0)
    _ws_log: str | None = None
    _ws_faults: tuple = ()

    def start(self):  # parent side
        recorder: Recorder = self._ws_recorder
        key = self._ws_key
        recorder.begin(key)
        error = None
        try:
            for fault in self._ws_parent_faults:
                _faults.apply_parent_fault(fault, recorder.first_begin(key[0]))
            super().start()
            if any(f.at == "in_start" for f in self._ws_faults):
                recorder.records[key].pid = self.pid
                _faults.place_death(recorder.records[key])
        except BaseException as exc:
            error = exc
            raise
        finally:
            recorder.end(key, self.pid if error is None else None, error)
            del error

    def join(self, timeout=None):  # parent side: keep the exit code after the Process is gone
        super().join(timeout)
        self._ws_note_exit()

    def close(self):
        self._ws_note_exit()
        super().close()

    def _ws_note_exit(self) -> None:
        popen = getattr(self, "_popen", None)
        recorder = getattr(self, "_ws_recorder", None)
        if popen is not None and recorder is not None:
            code = popen.poll()
            if code is not None:
                recorder.records[self._ws_key].exitcode = code

    def __getstate__(self):  # what travels to a spawn/forkserver child
        state = self.__dict__.copy()
        state.pop("_ws_recorder", None)
        state.pop("_ws_parent_faults", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._ws_emit("boot")

    def run(self):  # child side
        if not getattr(self, "_ws_booted", False):
            self._ws_emit("boot")  # fork: nothing was unpickled
        self._ws_arm_stack_dump()
        self._ws_emit("ready")
        for fault in self._ws_faults:
            if fault.at in ("before_send", "while_waiting") and self._ws_log:
                gate = _gate(os.path.dirname(self._ws_log), fault.at, self._ws_key)
                self._ws_emit("placed", reached=_faults.wait_for_file(gate))
            _faults.apply_child_fault(fault)
        try:
            super().run()
        finally:
            # what the worker still maps when its target returns or raises: a segment it
            # leaves behind is mapped by no one later (see probes.shm.ShmWatch)

            self._ws_emit("exit", shm=shm_entries_mapped_by([os.getpid()]))

    def _ws_arm_stack_dump(self) -> None:
        """SIGUSR1 writes every thread's stack to ``stacks-PID.txt`` beside the event log
        (armed before "ready": only ready workers are ever signalled)."""
        if not self._ws_log:
            return
        import faulthandler
        import signal

        try:
            self._ws_stack_file = open(os.path.join(os.path.dirname(self._ws_log), f"stacks-{os.getpid()}.txt"), "w")
            faulthandler.register(signal.SIGUSR1, file=self._ws_stack_file, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            pass

    def _ws_emit(self, event: str, **extra) -> None:
        self._ws_booted = True
        if not self._ws_log:
            return
        line = json.dumps({"g": self._ws_key[0], "w": self._ws_key[1], "ev": event,
                           "pid": os.getpid(), "ppid": os.getppid(), "t": time.monotonic(), **extra})
        try:
            fd = os.open(self._ws_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the probe must never be the failure


_ctx = multiprocessing.get_context


class InstrumentedSpawnProcess(_InstrumentedProcessMixin, _ctx("spawn").Process):
    pass


class InstrumentedForkServerProcess(_InstrumentedProcessMixin, _ctx("forkserver").Process):
    pass


class InstrumentedForkProcess(_InstrumentedProcessMixin, _ctx("fork").Process):
    pass


_PROCESS_CLASSES = {
    "spawn": InstrumentedSpawnProcess,
    "forkserver": InstrumentedForkServerProcess,
    "fork": InstrumentedForkProcess,
}


def _gate(log_dir: str, state: str, key: tuple[int, int]) -> str:
    """The file whose creation lets worker ``key`` die at ``state``: the driver creates it as
    it reaches the state (a put, a get)."""
    return os.path.join(log_dir, f"{state}-{key[0]}-{key[1]}")


class _QueueWatch:
    """Driver side of the death states placed by queue traffic: a put through a context
    queue first lets a ``before_send`` worker started by then die and waits until it has;
    the first get after a put lets the ``while_waiting`` workers die. Puts are serialised
    while a death is awaited, so no put of another thread slips past it."""

    def __init__(self, recorder: Recorder, faults: _faults.FaultPlan, log_dir: str):
        self.owner = os.getpid()
        self._recorder, self._faults, self._log_dir = recorder, faults, log_dir
        self._lock = threading.Lock()
        self._done: set[tuple[int, int]] = set()
        self._sent = False

    def before_put(self) -> None:
        with self._lock:
            for fault in self._faults.deaths_at("before_send"):
                key = (self._generation(fault), fault.worker)
                rec = self._recorder.records.get(key)
                if key not in self._done and rec is not None and rec.pid is not None and rec.start_end is not None:
                    self._done.add(key)
                    self._open(fault.at, key)
                    _faults.place_death(rec)

    def after_put(self) -> None:
        self._sent = True

    def before_get(self) -> None:
        if not self._sent:
            return
        with self._lock:
            for fault in self._faults.deaths_at("while_waiting"):
                key = (self._generation(fault), fault.worker)
                if key not in self._done:
                    self._done.add(key)
                    self._open(fault.at, key)

    def _open(self, state: str, key: tuple[int, int]) -> None:
        with open(_gate(self._log_dir, state, key), "w"):
            pass

    def _generation(self, fault: _faults.Fault) -> int:
        return self._recorder.generation if fault.generation is None else fault.generation


class _WatchedQueue(multiprocessing.queues.Queue):
    """A ``multiprocessing`` queue whose driver-side puts and gets report to a
    :class:`_QueueWatch` (the watch is not pickled: a worker's copy is a plain queue)."""

    def __init__(self, maxsize: int = 0, *, ctx, watch: _QueueWatch):
        super().__init__(maxsize, ctx=ctx)
        self._ws_watch = watch

    def _driver_watch(self) -> _QueueWatch | None:
        watch = self.__dict__.get("_ws_watch")
        return watch if watch is not None and os.getpid() == watch.owner else None  # not a fork's copy

    def put(self, obj, block=True, timeout=None):
        watch = self._driver_watch()
        if watch is None:
            return super().put(obj, block, timeout)
        watch.before_put()
        super().put(obj, block, timeout)
        watch.after_put()

    def get(self, block=True, timeout=None):
        watch = self._driver_watch()
        if watch is not None:
            watch.before_get()
        return super().get(block, timeout)


def _remove_own_dir(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # a forked child's copy must never remove its parent's directory
        shutil.rmtree(path, ignore_errors=True)


class InstrumentedContext(BaseContext):
    """A ``multiprocessing`` context that records and perturbs worker starts.

    ``num_workers`` maps creation order to worker ids (i-th Process of a
    generation is worker i). ``hold_for_overlap`` (seconds) makes every start
    wait until the generation's remaining starts are in flight, so peak
    concurrency is observed rather than inferred from timing.
    """

    def __init__(self, method: str = "spawn", *, num_workers: int = 1, faults: _faults.FaultPlan | None = None,
                 log_dir: str | os.PathLike | None = None, hold_for_overlap: float | None = None):
        if method not in _PROCESS_CLASSES:
            raise ValueError(f"unknown start method {method!r}")
        self._name = method
        self._inner = multiprocessing.get_context(method)
        self.faults = faults or _faults.FaultPlan()
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="workerstart-events-"))
        # a context dropped without close() (a user's own test) still removes the directory it made
        self._remove = None if log_dir else weakref.finalize(self, _remove_own_dir, str(self.log_dir), os.getpid())
        self.log_path = self.log_dir / "events.jsonl"
        self._recorder = Recorder(num_workers, hold_for_overlap)
        self._queue_watch = (_QueueWatch(self._recorder, self.faults, str(self.log_dir))
                             if self.faults.deaths_at("before_send", "while_waiting") else None)

    # BaseContext uses _name for get_start_method(); the rest is delegated.
    def get_start_method(self, allow_none: bool = False) -> str:
        return self._name

    def get_context(self, method=None):
        if method is None or method == self._name:
            return self
        return super().get_context(method)

    def __getattr__(self, name: str) -> Any:
        # forkserver's set_forkserver_preload & co. live on the wrapped context.
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def Queue(self, maxsize: int = 0):
        if self._queue_watch is None:
            return self._inner.Queue(maxsize)
        return _WatchedQueue(maxsize, ctx=self._inner, watch=self._queue_watch)

    def Process(self, *args, **kwargs):
        cls = _PROCESS_CLASSES[self._name]
        proc = cls(*args, **kwargs)
        key = self._recorder.construct(proc)
        proc._ws_key = key
        proc._ws_log = str(self.log_path)
        proc._ws_recorder = self._recorder
        gen, worker = key
        mine = self.faults.for_worker(worker, gen)
        proc._ws_parent_faults = tuple(f for f in mine if f.kind in _faults.PARENT_KINDS)
        proc._ws_faults = tuple(f for f in mine if f.kind in _faults.CHILD_KINDS)
        return proc

    # --- controls and derived facts ----------------------------------------
    def begin_generation(self) -> int:
        """Call before an ``iter()`` that may build fewer than N processes."""
        with self._recorder.cond:
            if self._recorder.index:
                self._recorder.generation += 1
                self._recorder.index = 0
            return self._recorder.generation

    def records(self, generation: int | None = None) -> list[WorkerRecord]:
        self._merge_child_events()
        with self._recorder.cond:
            items = sorted(self._recorder.records.items())
            for key, rec in items:
                ref = self._recorder.procs.get(key)
                proc = ref() if ref else None
                if proc is not None and getattr(proc, "_popen", None) is not None:
                    code = proc._popen.poll()
                    rec.exitcode = code if code is not None else rec.exitcode
            return [r for (g, _), r in items if generation is None or g == generation]

    def _merge_child_events(self) -> None:
        try:
            lines = self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return
        with self._recorder.cond:
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a child killed mid-write
                rec = self._recorder.records.get((ev["g"], ev["w"]))
                if rec is not None and ev["ev"] == "exit":
                    rec.exited = ev["t"]
                if rec is not None and ev["ev"] == "placed":
                    rec.death_placed = bool(ev.get("reached"))
                    rec.death_placed_at = ev["t"] if rec.death_placed else None
                if rec is not None and ev["ev"] in ("boot", "ready"):
                    setattr(rec, ev["ev"], ev["t"])
                    rec.pid = rec.pid or ev["pid"]
                    if ev["ev"] == "boot":
                        rec.ppid = ev.get("ppid")

    def shm_at_exit(self) -> dict[str, int]:
        """``/dev/shm`` entries (name -> inode) the workers mapped or held open as they exited."""
        out: dict[str, int] = {}
        try:
            lines = self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("ev") == "exit":
                out.update({str(k): int(v) for k, v in (ev.get("shm") or {}).items()})
        return out

    def forked_by(self) -> set[str]:
        """Which process forked the workers this context started, as each worker saw it:
        ``driver`` (this process: spawn, fork), ``multiprocessing forkserver`` (this
        process's), or ``another process`` (e.g. a forkserver the loader runs itself)."""
        from multiprocessing import forkserver

        server = getattr(forkserver._forkserver, "_forkserver_pid", None)
        out = set()
        for rec in self.records():
            if rec.ppid is None:
                continue
            out.add("driver" if rec.ppid == os.getpid() else
                    "multiprocessing forkserver" if rec.ppid == server else "another process")
        return out

    def peak_concurrent_starts(self, generation: int = 0) -> int:
        return self._recorder.peak.get(generation, 0)

    def built_all_before_first_start(self, generation: int = 0) -> bool:
        recs = self.records(generation)
        begins = [r.start_begin for r in recs if r.start_begin is not None]
        if not begins:
            return False
        first = min(begins)
        built = [r for r in recs if r.constructed is not None and r.constructed <= first]
        return len(built) >= self._recorder.num_workers

    def start_order(self, generation: int = 0) -> list[int]:
        recs = [r for r in self.records(generation) if r.start_end is not None]
        return [r.worker for r in sorted(recs, key=lambda r: r.start_end)]

    def wait_booted(self, timeout: float, poll: float = 0.05) -> list[int]:
        """Wait until every worker whose ``start()`` returned is ready (its ``run()`` began) or
        has ended; return the workers still booting when ``timeout`` ran out. A worker still
        unpickling its queues when its loader shuts down finds their semaphores unlinked and
        dies, which changes the shutdown: waiting puts that event at one state, every time."""
        import psutil

        from pytest_workerstart.probes.leaks import alive

        def running(pid: int) -> bool:
            try:
                return alive(psutil.Process(pid))
            except psutil.Error:
                return False

        end = time.monotonic() + timeout
        while True:
            booting = [r.worker for r in self.records() if r.pid is not None and r.start_end is not None
                       and r.ready is None and r.exitcode is None and running(r.pid)]
            if not booting or time.monotonic() >= end:
                return booting
            time.sleep(poll)

    def dump_worker_stacks(self, patience: float = 1.0) -> str:
        """Every thread's stack of each live, ready worker (SIGUSR1 to faulthandler)."""
        import signal

        import psutil

        self._merge_child_events()
        mine = {c.pid for c in psutil.Process().children(recursive=True)}
        targets = [r for r in self._recorder.records.values() if r.pid in mine and r.ready is not None]
        for r in targets:
            try:
                os.kill(r.pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(patience if targets else 0)
        parts = []
        for r in targets:
            try:
                text = (self.log_dir / f"stacks-{r.pid}.txt").read_text(errors="replace")
            except OSError:
                text = ""
            parts.append(f"--- worker {r.worker} (pid {r.pid}) ---\n{text.strip() or '(no stack written)'}")
        return "\n".join(parts)

    def worker_tree(self) -> list:
        """The live workers this context started and what they started in turn (descendants of
        this process only), as ``psutil.Process`` objects."""
        import psutil

        self._merge_child_events()
        pids = {r.pid for r in self._recorder.records.values() if r.pid}
        tree = [c for c in psutil.Process().children(recursive=True) if c.pid in pids]
        for worker in list(tree):
            try:
                tree += [c for c in worker.children(recursive=True) if c not in tree]
            except psutil.Error:
                continue
        return tree

    def close(self) -> None:
        if self._remove is not None:
            self._remove()

    def __repr__(self) -> str:
        return f"<InstrumentedContext {self._name} faults={self.faults.describe()}>"
