"""Leak snapshots: take one before, diff after, poll with patience.

Covers descendant processes (psutil, recursive; zombies included), Python
threads, open fds (classified), ``/dev/shm`` entries, and multiprocessing's
``_dangling`` processes. The resource tracker and forkserver are long-lived
helpers shared by every loader, so they are excluded by name.

Attribution: only what belongs to the tree under test counts. Processes are
this process's descendants, keyed by (pid, create time). A ``/dev/shm`` entry
(named semaphore, torch or POSIX shared memory) is ours only while a process
of that tree maps it (``/proc/PID/maps``) or holds it open (``/proc/PID/fd``):
entries of other jobs on the machine, even ones created meanwhile, are never
counted. An entry whose creator has exited is mapped by no one: :class:`~.probes.shm.ShmWatch`
attributes those while the tree runs (unlinking what it attributed, and killing what
outlived its bound, is :mod:`pytest_workerstart.harness.cleanup`'s).

``wait_clean`` polls until the diff is empty or ``timeout`` passes (as loky and
CPython's ``test.support`` do) so slow-but-correct teardown is not a false alarm.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable

import psutil

from pytest_workerstart.probes.proc_start import started
from pytest_workerstart.probes.shm import attributed_shm

HELPER_MARKERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
    "pytest_workerstart.harness.reaper",  # the guard (see harness/reaper.py)
)
#: Callables naming more helper fds of this process, registered by what owns them (the
#: harness's zygote registers its pipes): a probe observes them, it does not run them.
HELPER_FD_SOURCES: list[Callable[[], set[int]]] = []
#: Callables naming helper processes by pid (the zygote registers itself). By pid, not by
#: command line: a scenario forked from the zygote carries its command line, and so does every
#: worker such a scenario forks under the fork context, which must count.
HELPER_PID_SOURCES: list[Callable[[], set[int]]] = []

#: How long what a loader stopped after a failure may take to be gone (a worker's interpreter
#: teardown, a worker polling a stop event) before it counts as leaked: PATIENCE_BOOTS spawn
#: boots as measured in the run, at least PATIENCE_FLOOR_S (torch's workers poll every 5 s).
#: A loader's own synchronous shutdown (torch joins each worker for up to 5 s) runs before the
#: wait begins, so a loader that still holds its workers fails at this bound, not at a fixed one.
PATIENCE_FLOOR_S = 5.0
PATIENCE_BOOTS = 2.0


def patience(boot_cost: float) -> float:
    """Seconds :meth:`LeakSnapshot.wait_clean` waits after a failure, given the run's boot cost."""
    return max(PATIENCE_FLOOR_S, PATIENCE_BOOTS * boot_cost)


def _is_helper(proc: psutil.Process) -> bool:
    """The shared resource tracker or forkserver: a *direct* child with that cmdline.

    Workers forked by the forkserver inherit its cmdline, so the parent decides.
    """
    try:
        if proc.ppid() != os.getpid():
            return False
        if any(proc.pid in source() for source in HELPER_PID_SOURCES):
            return True
        cmd = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        return False
    return any(m in cmd for m in HELPER_MARKERS)


def helpers(marker: str | None = None) -> list[psutil.Process]:
    """This process's helpers (:data:`HELPER_MARKERS`, or only ``marker``'s), e.g. its forkservers."""
    out = []
    for proc in psutil.Process().children():
        try:
            if _is_helper(proc) and (marker is None or marker in " ".join(proc.cmdline())):
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a killed child nobody reaped yet counts as gone)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def fd_targets(pid: int | str = "self") -> dict[int, str]:
    """fd -> what it points at (``pipe:[inode]``, a path, ...) for process ``pid``; empty where
    ``/proc`` cannot say (not Linux, the process gone)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    out: dict[int, str] = {}
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed while listing (or the listing fd itself)
    return out


def _pipe_and_socket_fds(pid: int | str) -> set[str]:
    """The ``pipe:[inode]`` / ``socket:[inode]`` targets process ``pid`` holds open."""
    return {t for t in fd_targets(pid).values() if t.startswith(("pipe:", "socket:"))}


def helper_fds() -> set[int]:
    """fds the driver holds for its helpers: the resource tracker, forkservers (a
    loader's own included) and the zygote.

    They live as long as the process, belong to no iterator, and appear on first
    use: never count them as leaks. Named ones are read from multiprocessing
    (private attributes, read defensively); the rest are the driver's pipes and
    sockets whose other end a helper holds, which covers a server a loader runs
    for itself without the suite knowing its code. (A forkserver also holds the
    status pipe of each worker it forked while that worker runs: a live worker
    is reported as a process, not through that fd.)
    """
    fds: set[int] = set()
    shared: set[str] = set()
    for proc in helpers():
        shared |= _pipe_and_socket_fds(proc.pid)
    if shared:
        try:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{name}") in shared:
                        fds.add(int(name))
                except OSError:
                    continue
        except OSError:
            pass
    try:
        from multiprocessing import forkserver, resource_tracker

        for value in (getattr(resource_tracker._resource_tracker, "_fd", None),
                      getattr(forkserver._forkserver, "_forkserver_alive_fd", None)):
            if isinstance(value, int) and value >= 0:
                fds.add(value)
    except Exception:
        pass
    for source in HELPER_FD_SOURCES:
        fds |= source()
    return fds


def _fd_kind(target: str) -> str:
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("/dev/shm/"):
        return "shm"
    if target.startswith("anon_inode:"):
        return target.split(":", 1)[1].strip("[]")
    return "file"


@dataclasses.dataclass(frozen=True)
class ProcInfo:
    pid: int
    #: seconds since boot at its start (:func:`~pytest_workerstart.probes.proc_start.started`)
    started: float
    cmdline: str
    status: str

    def __str__(self) -> str:
        return f"pid {self.pid} [{self.status}] {self.cmdline[:160]}"


@dataclasses.dataclass
class LeakSnapshot:
    processes: dict[tuple[int, float], ProcInfo]
    threads: dict[int, str]
    fds: dict[int, str]
    shm: set[str]
    dangling: set[int]
    taken_at: float

    @classmethod
    def take(cls, *, collect: bool = True) -> LeakSnapshot:
        if collect:
            gc.collect()
        me = psutil.Process()
        procs: dict[tuple[int, float], ProcInfo] = {}
        tree = [me.pid]
        for child in me.children(recursive=True):
            tree.append(child.pid)
            try:
                if _is_helper(child):
                    continue
                start = started(child.pid)
                if start is None:
                    continue
                with child.oneshot():
                    info = ProcInfo(child.pid, start, " ".join(child.cmdline()), child.status())
            except (psutil.Error, OSError):
                continue
            procs[(info.pid, info.started)] = info
        threads = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        skip = helper_fds()
        fds = {fd: target for fd, target in fd_targets().items() if fd not in skip}
        shm = attributed_shm(tree)
        dangling = set()
        try:
            from multiprocessing import process as _mp_process

            for p in list(_mp_process._dangling):
                popen = getattr(p, "_popen", None)
                if popen is not None and popen.poll() is None:
                    dangling.add(p.pid)
        except Exception:
            pass
        return cls(procs, threads, fds, shm, dangling, time.monotonic())

    # --- diffing -----------------------------------------------------------
    def diff(self, after: LeakSnapshot) -> LeakReport:
        new_fds = {}
        for fd, target in after.fds.items():
            if self.fds.get(fd) != target:
                new_fds[fd] = target
        return LeakReport(
            processes=[p for k, p in after.processes.items() if k not in self.processes],
            threads=[f"{name} (ident {ident})" for ident, name in after.threads.items() if ident not in self.threads],
            fds={fd: t for fd, t in new_fds.items() if not t.startswith("/proc/")},
            shm=sorted(after.shm - self.shm),
            dangling=sorted(after.dangling - self.dangling),
        )

    @classmethod
    def wait_clean(cls, before: LeakSnapshot, timeout: float = 10.0, interval: float = 0.1,
                   kinds: Iterable[str] | None = None) -> LeakReport:
        """Poll until nothing of ``kinds`` leaked since ``before`` or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            report = before.diff(cls.take()).only(kinds)
            if not report or time.monotonic() >= deadline:
                return report
            time.sleep(interval)
            interval = min(interval * 1.5, 1.0)


KINDS = ("processes", "threads", "fds", "shm", "dangling")


@dataclasses.dataclass
class LeakReport:
    processes: list[ProcInfo]
    threads: list[str]
    fds: dict[int, str]
    shm: list[str]
    dangling: list[int]

    def only(self, kinds: Iterable[str] | None) -> LeakReport:
        if kinds is None:
            return self
        kinds = set(kinds)
        unknown = kinds - set(KINDS)
        if unknown:
            raise ValueError(f"unknown leak kinds {sorted(unknown)}")
        return LeakReport(
            processes=self.processes if "processes" in kinds else [],
            threads=self.threads if "threads" in kinds else [],
            fds=self.fds if "fds" in kinds else {},
            shm=self.shm if "shm" in kinds else [],
            dangling=self.dangling if "dangling" in kinds else [],
        )

    def __bool__(self) -> bool:
        return bool(self.processes or self.threads or self.fds or self.shm or self.dangling)

    def counts(self) -> dict[str, int]:
        fd_kinds: dict[str, int] = {}
        for target in self.fds.values():
            kind = _fd_kind(target)
            fd_kinds[kind] = fd_kinds.get(kind, 0) + 1
        return {
            "processes": len(self.processes),
            "zombies": sum(p.status == psutil.STATUS_ZOMBIE for p in self.processes),
            "threads": len(self.threads),
            "fds": len(self.fds),
            **{f"fds.{k}": v for k, v in sorted(fd_kinds.items())},
            "semaphores": sum(n.startswith("sem.") for n in self.shm),
            "shm": len(self.shm),
            "dangling": len(self.dangling),
        }

    def format(self) -> str:
        lines = []
        for p in self.processes:
            lines.append(f"  process: {p}")
        for t in self.threads:
            lines.append(f"  thread: {t}")
        for fd, target in sorted(self.fds.items()):
            lines.append(f"  fd {fd} ({_fd_kind(target)}): {target}")
        for name in self.shm:
            lines.append(f"  /dev/shm: {name}")
        for pid in self.dangling:
            lines.append(f"  multiprocessing._dangling: pid {pid}")
        return "\n".join(lines) or "  (nothing)"

    def summary(self) -> str:
        c = self.counts()
        return ", ".join(f"{v} {k}" for k, v in c.items() if v) or "nothing"
