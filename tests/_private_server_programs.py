"""Datasets and programs for tests/test_private_forkserver.py (importable by workers and scenarios)."""

import os
import time

from torch.utils.data import IterableDataset, get_worker_info

from pytest_workerstart.datasets import WorkerTagDataset


class LastWorkersOnly(IterableDataset):
    """Items only in the shards of workers ``first..``: the first workers' shards are empty."""

    def __init__(self, first: int, per_worker: int = 3):
        self.first, self.per_worker = first, per_worker

    def __iter__(self):
        info = get_worker_info()
        wid = info.id if info is not None else 0
        if wid < self.first:
            return iter(())
        return iter(range(wid * 100, wid * 100 + self.per_worker))


class ParentTag(WorkerTagDataset):
    """Each sample also says which process forked the worker (the kernel's answer)."""

    def __getitem__(self, i):
        return {**super().__getitem__(i), "ppid": os.getppid()}


def _loader(n=2, p=2, persistent=False, **kw):
    from pytest_workerstart.reference import ParallelStartDataLoader

    return ParallelStartDataLoader(ParentTag(4 * n), batch_size=2, num_workers=n,
                                   multiprocessing_context="forkserver", worker_start_parallelism=p,
                                   persistent_workers=persistent, **kw)


def one_epoch() -> list[int]:
    """A forkserver loader to the end, in a fresh interpreter (its exit is judged)."""
    return sorted(int(i) for b in _loader() for i in b["index"])


def construct_only() -> None:
    """Construct and leave at once: the server is still importing torch at exit."""
    _loader()


def serve_and_wait(ready_path: str) -> None:
    """Persistent workers alive, then the pids of the server and workers to ``ready_path``; wait to be killed."""
    from pytest_workerstart.reference import private_forkserver

    dl = _loader(persistent=True)
    pids = {int(p) for b in dl for p in b["pid"]}
    with open(ready_path + ".tmp", "w") as f:
        f.write(" ".join(map(str, [private_forkserver.current().pid, *sorted(pids)])))
    os.rename(ready_path + ".tmp", ready_path)
    time.sleep(600)


def server_only_and_wait(ready_path: str) -> None:
    """A server with no worker alive (an epoch ended), then wait to be killed."""
    from pytest_workerstart.reference import private_forkserver

    list(_loader())
    with open(ready_path + ".tmp", "w") as f:
        f.write(str(private_forkserver.current().pid))
    os.rename(ready_path + ".tmp", ready_path)
    time.sleep(600)


def fork_then_use() -> str:
    """A driver with a server forks a child that uses a loader too: the child must start its
    own server (it is not the parent's server's parent) and the parent's stays in use."""
    import threading

    from pytest_workerstart.reference import private_forkserver

    list(_loader())
    parent = private_forkserver.current().pid
    # torch closes its index queues without joining their feeder threads (cancel_join_thread),
    # so they may still be flushing here; forking with threads is the caller's risk, so wait
    deadline = time.monotonic() + 30
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == 1, threading.enumerate()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            got = sorted(int(i) for b in _loader() for i in b["index"])
            mine = private_forkserver.current().pid
            code = 0 if got == list(range(8)) and mine not in (None, parent) else 2
            private_forkserver.stop()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    again = sorted(int(i) for b in _loader() for i in b["index"])
    kept = private_forkserver.current().pid == parent
    return f"child exit {os.waitstatus_to_exitcode(status)}, parent server kept {kept}, " \
           f"parent epoch ok {again == list(range(8))}"
