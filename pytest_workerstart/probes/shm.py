"""``/dev/shm`` entries and who they belong to.

An entry (named semaphore, torch or POSIX shared memory) belongs to a process tree only while a
process of that tree maps it (``/proc/PID/maps``) or holds it open (``/proc/PID/fd``): entries of
other jobs on the machine, even ones created meanwhile, are never counted. An entry whose creator
has exited is mapped by no one: :class:`ShmWatch` attributes those while the tree runs.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterable

import psutil

#: the names multiprocessing and torch give their entries
SHM_PATTERN = re.compile(r"^(sem\.mp-|torch_|psm_|wnsm_|mp-)")
#: torch's file-descriptor sharing names a segment after the pid that creates it and unlinks it
#: at once: one is left only when its creator dies in between, unmapped, and is known by its name
TORCH_FD_NAME = re.compile(r"^torch_(\d+)_")


def inodes_of(pid: int | str) -> set[int]:
    """Inodes of ``/dev/shm`` files that process ``pid`` maps or holds open.

    Inodes, not names: glibc's ``sem_open`` maps a temporary file and then
    links it to the final name, so maps shows ``sem.XXXXXX (deleted)`` for a
    semaphore that lives on as ``sem.mp-...``; the inode is the same.
    """
    inodes: set[int] = set()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith(b"/dev/shm/"):
                    inodes.add(int(parts[4]))
    except (OSError, ValueError):
        pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return inodes


def shm_entries() -> dict[str, int]:
    """Every ``/dev/shm`` entry, name -> inode."""
    out: dict[str, int] = {}
    try:
        entries = os.listdir("/dev/shm")
    except FileNotFoundError:
        return out
    for name in entries:
        try:
            out[name] = os.stat(f"/dev/shm/{name}").st_ino
        except OSError:
            continue
    return out


def attributed_shm(pids: Iterable[int | str]) -> set[str]:
    """Existing ``/dev/shm`` entries of the names multiprocessing and torch use
    that any of ``pids`` maps or holds open.

    An entry mapped but already unlinked (torch's file_descriptor strategy
    unlinks at once) is no /dev/shm entry and is not returned.
    """
    named = {name: ino for name, ino in shm_entries().items() if SHM_PATTERN.match(name)}
    return set(mapped_by(pids, named))


def shm_entries_mapped_by(pids: Iterable[int | str]) -> dict[str, int]:
    """Existing ``/dev/shm`` entries of any name (name -> inode) that any of ``pids`` maps or holds open."""
    return mapped_by(pids, shm_entries())


def mapped_by(pids: Iterable[int | str], entries: dict[str, int]) -> dict[str, int]:
    """Those of ``entries`` (name -> inode) that any of ``pids`` maps or holds open."""
    if not entries:  # reading a torch process's maps costs about a millisecond: not for nothing
        return {}
    inodes: set[int] = set()
    for pid in pids:
        inodes |= inodes_of(pid)
    return {name: ino for name, ino in entries.items() if ino in inodes}


class ShmWatch:
    """The ``/dev/shm`` entries a process tree creates while a block runs, and which outlive it.

    The tree (``root``, by default this process, and its descendants, helpers
    included: this process's forkserver works for the loader) is sampled every ``interval``
    from a thread, and at once whenever an entry appears in ``/dev/shm``
    (inotify): an entry created during the block that any member maps or
    holds open at a sample is the tree's. Snapshots at the end cannot see
    these: a worker that created a segment and exited maps nothing any more.
    Workers started through the suite's context also report what they map
    as they exit (:meth:`note`). Entries present before the block are never
    counted, whoever maps them; one unmapped within the moment between its
    creation and the sample that follows, by a process that does not report
    at exit, is not seen.
    """

    def __init__(self, interval: float = 0.05, root: int | None = None,
                 also: Callable[[], Iterable[int]] | None = None, eager: bool = True,
                 member: Callable[[int], bool] | None = None, quiet: re.Pattern | None = None):
        self.interval = interval
        self.eager = eager  # also sample whenever an entry appears (False: on the clock only)
        self.root = root  # the tree's root pid (default: this process)
        self.also = also  # more members, e.g. a scenario's session, orphans included
        self.member = member  # which of root's descendants belong to the tree (default: all)
        self.quiet = quiet  # names whose appearance alone wakes no sample
        self.seen: dict[str, int] = {}
        #: every pid a sample found in the tree: the creators :func:`named_for` recognises
        self.pids: set[int] = set()
        self.before: dict[str, int] = {}  # every entry when the block began: never the tree's
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] = (-1, -1)  # a pipe whose write ends the watch's wait at once

    def _sample(self) -> None:
        pids = [self.root or os.getpid()]
        try:
            pids += [c.pid for c in psutil.Process(pids[0]).children(recursive=True)
                     if self.member is None or self.member(c.pid)]
        except psutil.Error:
            pass
        if self.also is not None:
            pids += list(self.also())
        self.pids.update(int(p) for p in pids)
        # only entries neither there before nor attributed yet can change what the watch knows
        with self._lock:
            open_ = {name: ino for name, ino in shm_entries().items()
                     if self.before.get(name) != ino and self.seen.get(name) != ino}
        self.note(mapped_by(pids, open_))

    def note(self, entries: dict[str, int]) -> None:
        """Attribute ``entries`` (name -> inode) seen by other means, e.g. what the suite's
        workers mapped when they exited (:meth:`InstrumentedContext.shm_at_exit`)."""
        with self._lock:
            for name, ino in entries.items():
                if self.before.get(name) != ino:
                    self.seen[name] = ino

    def _open_notify(self):
        """An inotify watch on /dev/shm, or None (not eager, or no inotify): opened before the
        block begins, so a snapshot of this process's fds taken inside the block sees it."""
        if not self.eager:
            return None
        try:
            from inotify_simple import INotify, flags

            notify = INotify()
        except OSError:  # no inotify: samples on the clock only
            return None
        try:
            notify.add_watch("/dev/shm", flags.CREATE | flags.MOVED_TO)
        except OSError:  # no /dev/shm
            notify.close()
            return None
        return notify

    def _run(self, notify) -> None:
        try:
            while not self._stop.is_set():
                if notify is None:
                    self._stop.wait(self.interval)
                else:  # wakes as soon as an entry appears, or the block ends
                    ready = select.select([notify.fileno(), self._wake[0]], [], [], self.interval)[0]
                    if self._wake[0] in ready:
                        break
                    events = notify.read(timeout=0) if ready else []
                    if events and self.quiet is not None and all(self.quiet.match(e.name) for e in events):
                        continue
                self._sample()
        finally:
            if notify is not None:
                notify.close()

    def __enter__(self) -> ShmWatch:
        self.before = shm_entries()
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(self._open_notify(),), name="workerstart-shm-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            os.write(self._wake[1], b"x")
            self._thread.join()
            self._thread = None
            for fd in self._wake:
                os.close(fd)
        self._sample()

    def created(self) -> dict[str, int]:
        """The tree's entries: those a sample saw it map or hold, and torch's named for one of its pids."""
        with self._lock:
            return {**named_for(self.pids, self.before), **self.seen}

    def left(self, timeout: float = 0.0) -> list[str]:
        """Seen entries that still exist (same inode), polled until none or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            now = shm_entries()
            left = sorted(n for n, ino in self.seen.items() if now.get(n) == ino)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)


def named_for(pids: Iterable[int], before: dict[str, int]) -> dict[str, int]:
    """Entries created since ``before`` whose name says one of ``pids`` created them (torch's
    ``torch_<pid>_...``), name -> inode."""
    pids = {int(p) for p in pids}
    return {name: ino for name, ino in shm_entries().items()
            if before.get(name) != ino and (m := TORCH_FD_NAME.match(name)) and int(m.group(1)) in pids}
