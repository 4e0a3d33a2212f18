"""The reference against torch's DataLoader where user code can tell them apart.

Each case runs the same thing on torch's ``DataLoader`` and on the reference and
compares what a user observes. Differences that remain are listed, with their
reasons, in docs/reference.md ("Where it differs from torch").
"""

import faulthandler
import gc
import multiprocessing
import os
import pickle
import re
import signal
import time
import warnings
from typing import List  # noqa: UP035 - the spelling older annotated code uses

# imported before any fork: a forked worker's first import of numpy.random can find the
# import lock held by another thread of this process (KeyError in the child, which dies)
import numpy.random  # noqa: F401
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pytest_workerstart.reference import ParallelStartDataLoader

# torch DataLoaders run in this process: their SIGCHLD handler and worker pids go with each test
pytestmark = pytest.mark.usefixtures("torch_process_state")

LOADERS = {"torch": (DataLoader, {}), "reference-p1": (ParallelStartDataLoader, {"worker_start_parallelism": 1}),
           "reference-p2": (ParallelStartDataLoader, {"worker_start_parallelism": 2})}


class DiesBySignal(Dataset):
    """Item 3 kills the worker that computes it with ``signum``."""

    def __init__(self, signum: int):
        self.signum = signum

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            faulthandler.disable()  # a fork worker inherits pytest's: its dump of the signal is noise here
            os.kill(os.getpid(), self.signum)
        return torch.tensor([i])


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_type_subscription(loader):
    """Annotated code (``def make() -> DataLoader[Batch]``) keeps working when the class is swapped."""
    cls, _ = LOADERS[loader]
    for item in (List[torch.Tensor], list[torch.Tensor]):  # noqa: UP006
        assert cls[item].__origin__ is cls


#: torch's race when a worker dies while the driver fetches a batch's shared-memory fd from it:
#: the connection is refused or reset (ConnectionError) or closed before its handshake (EOFError)
FD_FETCH_RACE = (ConnectionError, EOFError)


def _detached(exc: BaseException) -> BaseException:
    """The caught error, without the tracebacks whose frames hold the failed iterator; the caller
    holds nothing else of it (not pytest's ``ExceptionInfo``, whose own tuple keeps the traceback).

    Held, the iterator keeps its workers' pids registered with torch's SIGCHLD handler:
    the next child to exit, anywhere in this process, raises that worker's death again."""
    # The iterator shuts down its workers and unregisters their pids as the tracebacks go (or in
    # the collection); torch removes the pids last, so a worker exiting during that shutdown
    # would make its SIGCHLD handler raise the dead worker's error once more: SIGCHLD waits
    # until the pids are gone.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        todo, seen = [exc], set()
        while todo:
            e = todo.pop()
            if e is not None and id(e) not in seen:
                seen.add(id(e))
                e.__traceback__ = None
                todo += [e.__cause__, e.__context__]
        del e
        gc.collect()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return exc


def _error(loader: str, context: str, signum: int) -> BaseException:
    cls, kwargs = LOADERS[loader]
    dl = cls(DiesBySignal(signum), num_workers=2, batch_size=1, multiprocessing_context=context, **kwargs)
    with pytest.raises((RuntimeError, *FD_FETCH_RACE)) as info:
        for _ in dl:
            pass
    del dl
    exc = info.value
    del info
    return _detached(exc)


#: torch's words for a dead worker: its liveness check's (TORCH_EXITED), and its SIGCHLD handler's,
#: which names the signal or the exit code and wins when it runs first (it sees only the driver's
#: own children, so never a forkserver's workers; it raises wherever the main thread is).
TORCH_EXITED = re.compile(r"^DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly")
TORCH_SIGCHLD = re.compile(r"^DataLoader worker \(pid \d+\) exited unexpectedly with exit code \d+\. Details are lost")


#: torch's __del__ may raise from its SIGCHLD handler while it joins the other worker ("Exception
#: ignored in"), the reference's too (it keeps torch's handler): not the error these tests compare
SHUTDOWN_RACE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@SHUTDOWN_RACE
@pytest.mark.parametrize("context, signum", [  # slow: each boot imports torch, or starts a server
    ("fork", signal.SIGSEGV), ("fork", signal.SIGKILL),
    pytest.param("forkserver", signal.SIGSEGV, marks=pytest.mark.slow),
    pytest.param("spawn", signal.SIGSEGV, marks=pytest.mark.slow)])
def test_a_worker_killed_by_a_signal_is_named_in_torchs_words(context, signum):
    """torch names the signal only when its SIGCHLD handler wins the race; the reference always does."""
    name = re.escape(signal.strsignal(signum))
    wording = re.compile(rf"^DataLoader worker \(pid \d+\) is killed by signal: {name}\.")
    torch_error = _error("torch", context, signum)
    assert isinstance(torch_error, FD_FETCH_RACE) or wording.match(str(torch_error)) \
        or TORCH_EXITED.match(str(torch_error)), f"torch's wording changed: {torch_error}"
    for loader in ("reference-p1", "reference-p2"):
        error = _error(loader, context, signum)
        if isinstance(error, FD_FETCH_RACE):
            continue  # the same race as torch's, raised by the same code (docs/reference.md)
        assert isinstance(error, RuntimeError)
        assert wording.match(str(error)), f"{loader}: {error}"


# --- the same scenario on both, compared ------------------------------------------

class Items(Dataset):
    """Item i is ``tensor([i])``; ``fault`` at item 3 in a worker: "raise", "exit" (status 3) or "sleep" (4 s)."""

    def __init__(self, n: int = 8, fault: str | None = None):
        self.n, self.fault = n, fault

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 3 and self.fault == "raise":
            raise ValueError("item 3 is bad")
        if i == 3 and self.fault == "exit":
            os._exit(3)
        if i == 3 and self.fault == "sleep":
            time.sleep(4)
        return torch.tensor([i])


def _make(loader: str, dataset, **kw):
    cls, extra = LOADERS[loader]
    if kw.get("num_workers"):
        kw.setdefault("multiprocessing_context", "fork")
    return cls(dataset, **kw, **extra)


def _observed(exc: BaseException) -> dict:
    """What user code can see of an error: its torch-level type, message start, and chaining."""
    return {"is": [t.__name__ for t in type(exc).__mro__ if t.__module__ in ("builtins", "queue")][0],
            "first_line": str(exc).splitlines()[0], "cause": type(exc.__cause__).__name__,
            "suppress_context": exc.__suppress_context__}


def _raised(loader: str, dataset, **kw) -> dict:
    """What iterating raises; again (3 tries at most) while it is torch's fd-fetch race
    (:data:`FD_FETCH_RACE`), which torch and the reference (the same receiving code) both hit
    now and then."""
    for _ in range(3):
        with pytest.raises(BaseException) as info:
            for _ in _make(loader, dataset, num_workers=2, batch_size=1, **kw):
                pass
        exc = info.value
        del info
        exc = _detached(exc)
        if not isinstance(exc, FD_FETCH_RACE):
            break
    return _observed(exc)


@pytest.mark.parametrize("loader", ["reference-p1", "reference-p2"])
def test_batches_len_and_public_attributes_match(loader):
    g = {"generator": torch.Generator().manual_seed(3)}
    kw = dict(batch_size=3, shuffle=True, num_workers=2, drop_last=True, prefetch_factor=3, persistent_workers=True)
    ours, theirs = _make(loader, Items(10), **kw, **g), _make("torch", Items(10), **kw,
                                                              generator=torch.Generator().manual_seed(3))
    assert len(ours) == len(theirs)
    for _ in range(2):  # two epochs: persistent workers reused
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
    public = {k for k in dir(theirs) if not k.startswith("_")}
    assert public <= set(dir(ours)), f"missing: {public - set(dir(ours))}"
    for name in sorted(public):
        a, b = getattr(theirs, name), getattr(ours, name)
        if callable(a) and not isinstance(a, type) and name not in ("collate_fn", "worker_init_fn"):
            continue
        if name in ("dataset", "generator"):
            continue  # each loader got its own instance
        assert type(a) is type(b) and (a == b or name in ("sampler", "batch_sampler")), (name, a, b)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_pickles_like_torch(loader):
    """Picklable before iteration; a live iterator of persistent workers refuses, as torch's does."""
    dl = _make(loader, Items(), batch_size=2, num_workers=0)
    assert [b.tolist() for b in pickle.loads(pickle.dumps(dl))] == [b.tolist() for b in dl]
    dl = _make(loader, Items(), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(dl)
    next(it)
    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        pickle.dumps(dl)
    del it, dl


def _warnings(loader: str) -> list[tuple]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dl = _make(loader, Items(), batch_size=2, num_workers=2 * (os.cpu_count() or 1) + 2)
        it = iter(dl)
        next(it)
        del it, dl
    return [(w.category, str(w.message), os.path.basename(w.filename), w.lineno) for w in caught
            if "worker" in str(w.message)]


@pytest.mark.parametrize("loader", ["reference-p1", "reference-p2"])
def test_the_worker_number_warning_is_torchs(loader):
    """Same category, text and location (torch's module), so a filter by module treats both alike."""
    assert _warnings(loader) == _warnings("torch") != []


#: (fault, context, loader): every fault under fork; under spawn and forkserver (slow: each boot
#: imports torch, or starts a server) a worker's exit, where the driver sees a death it did not fork
FAULTS = [(fault, "fork", loader) for fault in ("raise", "exit", "sleep")
          for loader in ("reference-p1", "reference-p2")]
FAULTS += [pytest.param("exit", ctx, "reference-p2", marks=pytest.mark.slow) for ctx in ("spawn", "forkserver")]


@SHUTDOWN_RACE  # a worker that exits: the other's exit may reach torch's SIGCHLD handler in __del__
@pytest.mark.parametrize("fault, context, loader", FAULTS)
def test_worker_errors_read_like_torchs(fault, context, loader):
    """A worker that raises, exits or does not answer within ``timeout=``: the same builtin type,
    torch's words first (the reference may add which worker after them), the same chaining."""
    kw = {"timeout": 1} if fault == "sleep" else {}
    kw["multiprocessing_context"] = context
    torch_error, ours = _raised("torch", Items(fault=fault), **kw), _raised(loader, Items(fault=fault), **kw)
    assert ours["is"] == torch_error["is"], (ours, torch_error)
    if fault == "exit":
        # torch's wording and chaining depend on whether its SIGCHLD handler or its liveness
        # check saw the death first, and so do the reference's (it keeps torch's handler)
        if TORCH_SIGCHLD.match(ours["first_line"]):
            assert ours["cause"] == "NoneType" and not ours["suppress_context"], ours
        else:
            assert TORCH_EXITED.match(ours["first_line"]), ours
            # chained from whatever the queue's get raised: Empty at its poll interval, or what the
            # dead worker's fd sharing raises (ConnectionRefusedError under forkserver, under load)
            assert ours["cause"] != "NoneType" and ours["suppress_context"], ours
        return
    stem = re.sub(r"\d+", "N", torch_error["first_line"])
    assert re.sub(r"\d+", "N", ours["first_line"]).startswith(stem.rstrip(".")), (ours, torch_error)
    assert (ours["cause"], ours["suppress_context"]) == (torch_error["cause"], torch_error["suppress_context"]), (
        ours, torch_error)


@SHUTDOWN_RACE
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGABRT, signal.SIGBUS])
def test_more_signals_are_named_in_torchs_words(signum):
    test_a_worker_killed_by_a_signal_is_named_in_torchs_words("fork", signum)


class _FailsSecondStart(multiprocessing.context.ForkContext):
    """The fork context, except that its second ``Process.start()`` raises OSError (say, out of pids)."""

    def __init__(self):
        starts = [0]

        class Process(multiprocessing.context.ForkProcess):
            def start(self):
                starts[0] += 1
                if starts[0] == 2:
                    raise OSError(11, "Resource temporarily unavailable")
                return super().start()

        self.Process = Process


# torch's __del__ of a half-built iterator raises AttributeError ("Exception ignored in")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_failed_start_raises_the_start_error_type(loader):
    """torch lets the OSError through; the reference raises WorkerStartError, a RuntimeError whose
    ``__cause__`` is that OSError (docs/reference.md lists this difference)."""
    before = set(multiprocessing.active_children())
    with pytest.raises(BaseException) as info:
        iter(_make(loader, Items(), batch_size=1, num_workers=2, multiprocessing_context=_FailsSecondStart()))
    exc = info.value
    for proc in set(multiprocessing.active_children()) - before:  # stock torch leaves the worker that started
        proc.kill()
        proc.join()
    kind, cause, text = type(exc), type(exc.__cause__), str(exc)
    del exc, info
    gc.collect()  # torch's half-built iterator is collected here, not in a later test
    if loader == "torch":
        assert issubclass(kind, OSError), text
    else:
        assert issubclass(kind, RuntimeError) and issubclass(cause, OSError), text
        assert "failed to start" in text and "Resource temporarily unavailable" in text


class Pids(Dataset):
    """Item i is ``tensor([i, pid of the process that computed it])``."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i, os.getpid()])


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_break_then_del_then_a_new_epoch(loader):
    """After ``break``, a new ``iter()`` serves the whole epoch, and once the loader is deleted
    none of the workers that served it is left (only those: xdist neighbours have their own)."""
    dl = _make(loader, Pids(), batch_size=1, num_workers=2)
    workers = set()
    for k, b in enumerate(dl):
        workers.add(int(b[0, 1]))
        if k == 1:
            break
    epoch = [b.tolist() for b in dl]
    assert [row[0][0] for row in epoch] == list(range(8))
    workers |= {row[0][1] for row in epoch}
    del dl, b
    gc.collect()
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 4 and not _alive(workers), (workers, _alive(workers))
