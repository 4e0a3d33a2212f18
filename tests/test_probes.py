"""Each probe sees what it claims, on tiny stdlib programs with known answers."""

import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from pytest_workerstart.harness.cleanup import unlink_left
from pytest_workerstart.harness.runner import run_scenario
from pytest_workerstart.probes import digest as dg
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.deadline import tree_memory_over
from pytest_workerstart.probes.faults import FaultPlan, InjectedStartError
from pytest_workerstart.probes.leaks import LeakSnapshot
from pytest_workerstart.probes.shm import ShmWatch

from . import _mpprograms as progs

# --- memory guard ---------------------------------------------------------------

#: a parent that writes 256 MiB and then forks three children sharing those pages
_SHARING_TREE = """
import os, signal, sys, time
blob = b"x" * (256 << 20)
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    children.append(pid)

def stop(signum, frame):  # reaps its own children: none is left to init
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is read from /proc")
def test_memory_guard_counts_shared_pages_once_and_still_stops_a_tree_over_its_limit():
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _SHARING_TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        top = psutil.Process(proc.pid)
        deadline = time.monotonic() + 10
        while len(top.children()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [top, *top.children()]
        rss = sum(p.memory_info().rss for p in tree)
        pss = sum(p.memory_full_info().pss for p in tree)
        assert rss > pss + (512 << 20), (rss, pss)  # the shared 256 MiB counted in each of 4 processes
        assert tree_memory_over((rss + pss) // 2, root=proc.pid)() is None
        message = tree_memory_over(pss // 2, root=proc.pid)()
        assert message is not None and message.startswith("memory (PSS) of the driver and its workers reached"), message
        assert "(--workerstart-memory-limit); largest: pid " in message, message
    finally:
        proc.terminate()  # the parent kills and reaps its children
        proc.wait(timeout=10)
        proc.stdout.close()


# --- leak snapshot -------------------------------------------------------------


def test_leak_snapshot_sees_exactly_one_of_each():
    ctx = multiprocessing.get_context("spawn")
    sem = ctx.Semaphore()  # warm the resource tracker before the baseline
    del sem
    before = LeakSnapshot.take()
    proc = ctx.Process(target=progs.sleeper, daemon=True)
    proc.start()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="probe-leaked-thread", daemon=True)
    thread.start()
    fd = os.open(os.devnull, os.O_RDONLY)
    sem = ctx.Semaphore()
    try:
        report = LeakSnapshot.wait_clean(before, timeout=0.5)
        counts = report.counts()
        assert counts["processes"] == 1 and report.processes[0].pid == proc.pid
        assert counts["threads"] == 1 and "probe-leaked-thread" in report.threads[0]
        assert counts["semaphores"] == 1 and report.shm[0].startswith("sem.mp-")
        files = [t for t in report.fds.values() if t == os.devnull]
        assert len(files) == 1 and counts["fds.file"] == 1
        assert counts["fds"] == 1 + counts.get("fds.pipe", 0)  # + the spawn Process's own pipes
        assert counts["dangling"] == 1
        text = report.format()
        assert f"pid {proc.pid}" in text and "probe-leaked-thread" in text and "/dev/null" in text
    finally:
        proc.terminate()
        proc.join()
        proc.close()
        stop.set()
        thread.join()
        os.close(fd)
        del sem
    assert not LeakSnapshot.wait_clean(before, timeout=5), "cleanup should leave nothing"


def test_leak_snapshot_clean_program_reports_nothing():
    ctx = multiprocessing.get_context("fork")
    before = LeakSnapshot.take()
    p = ctx.Process(target=progs.quick)
    p.start()
    p.join()
    p.close()
    report = LeakSnapshot.wait_clean(before, timeout=5)
    assert not report, report.format()


def test_leak_snapshot_is_patient():
    """Teardown that finishes within the patience window is not a leak."""
    ctx = multiprocessing.get_context("fork")
    before = LeakSnapshot.take()
    p = ctx.Process(target=progs.sleeper, args=(0.8,))
    p.start()
    threading.Thread(target=lambda: (p.join(), p.close())).start()
    assert not LeakSnapshot.wait_clean(before, timeout=5)


# --- instrumented context --------------------------------------------------------


_ORPHAN = """
import os, sys, time
sys.path.insert(0, {root!r})
from tests import _mpprograms as progs
import psutil
while {test_pid} in [p.pid for p in psutil.Process().parents()]:  # until re-parented: outside the tree
    time.sleep(0.01)
progs.leave_untracked_segment({path!r}, keep_s=1.0)
"""


def test_shm_watch_attributes_what_its_tree_left_and_nothing_else(tmp_path):
    """A short-lived child's untracked block is seen (inotify wakes the watch: its clock
    is set to 10 s) and is left; a block that existed before, and an orphan's block
    (outside the tree), are never counted."""
    import subprocess
    import sys
    from multiprocessing import shared_memory

    before = shared_memory.SharedMemory(create=True, size=4096)
    orphan_name = tmp_path / "orphan"
    try:
        with ShmWatch(interval=10.0) as watch:
            before.buf[0] = 1  # mapped by this process all along: still not ours
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            subprocess.run(["sh", "-c", f"{sys.executable} -c \"$0\" &",
                            _ORPHAN.format(root=root, path=str(orphan_name), test_pid=os.getpid())], check=True)
            child = multiprocessing.get_context("spawn").Process(
                target=progs.leave_untracked_segment, args=(str(tmp_path / "child"),))
            child.start()
            child.join()
            deadline = time.monotonic() + 60
            while not orphan_name.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # the orphan's block exists and is mapped meanwhile
        ours = (tmp_path / "child").read_text()
        theirs = orphan_name.read_text()
        assert watch.left() == [ours], (watch.seen, ours, theirs)
        assert before.name not in watch.seen and theirs not in watch.seen
        assert unlink_left(watch) == [ours] and not os.path.exists(f"/dev/shm/{ours}")
        assert os.path.exists(f"/dev/shm/{theirs}"), "the watch must never touch another process tree's entry"
    finally:
        before.close()
        before.unlink()
        if (tmp_path / "child").exists():
            try:
                os.unlink(f"/dev/shm/{(tmp_path / 'child').read_text()}")
            except OSError:
                pass
        if orphan_name.exists():
            time.sleep(1.2)
            try:
                os.unlink(f"/dev/shm/{orphan_name.read_text()}")
            except OSError:
                pass


def test_shm_watch_reads_maps_only_while_an_entry_is_unaccounted_for(monkeypatch):
    """A sample reads the tree's maps (about a millisecond per torch process) only while an entry
    exists that was not there before and is not attributed yet; what it attributes is the same."""
    from multiprocessing import shared_memory

    from pytest_workerstart.probes import shm

    ours: set[str] = set()  # other jobs' entries (side-by-side self-tests) stay out of the listing
    real_entries, real_inodes = shm.shm_entries, shm.inodes_of
    monkeypatch.setattr(shm, "shm_entries", lambda: {n: i for n, i in real_entries().items() if n in ours})
    reads: list[int] = []
    monkeypatch.setattr(shm, "inodes_of", lambda pid: reads.append(pid) or real_inodes(pid))
    before = shared_memory.SharedMemory(create=True, size=4096)
    ours.add(before.name)
    made = None
    try:
        with ShmWatch(interval=0.01, eager=False) as watch:
            time.sleep(0.3)
            assert reads == [], "only an entry from before the block exists: nothing to read"
            made = shared_memory.SharedMemory(create=True, size=4096)
            ours.add(made.name)
            deadline = time.monotonic() + 30
            while made.name not in watch.seen and time.monotonic() < deadline:
                time.sleep(0.01)
            assert made.name in watch.seen and reads, "a new entry this process maps is read for and attributed"
            time.sleep(0.1)
            settled = len(reads)
            time.sleep(0.3)
            assert len(reads) == settled, "once attributed, it is not read for again"
        assert before.name not in watch.seen
    finally:
        for seg in (before, made):
            if seg is not None:
                seg.close()
                seg.unlink()



def test_shm_watch_holds_every_fd_it_opens_before_its_block_begins(monkeypatch):
    """A check's fd snapshots are taken inside the CheckEnv's watch: an fd the watch opened
    after ``__enter__`` returned would be counted as the loader's leak, depending on when the
    watch's thread first ran. inotify made slow to open shows it every time."""
    inotify_simple = pytest.importorskip("inotify_simple")
    real = inotify_simple.INotify

    def slow_inotify(*args, **kwargs):
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(inotify_simple, "INotify", slow_inotify)

    def fds() -> set[str]:  # held ones: not the /proc files a sample reads and closes at once
        targets = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                targets.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # closed since the listing
                continue
        return {t for t in targets if not t.startswith("/proc/")}

    with ShmWatch(interval=0.01) as watch:
        entered = fds()
        time.sleep(0.5)
        during = fds()
    assert watch._thread is None
    assert any("inotify" in t for t in entered), entered
    assert during - entered == set(), "the watch opened an fd after its block began"
    assert not any("inotify" in t for t in fds()), "the watch's inotify fd outlived its block"

@pytest.mark.parametrize("p", [1, 2, 4])
def test_peak_concurrency_is_observed(p):
    ctx = InstrumentedContext("fork", num_workers=4, hold_for_overlap=1.0)
    progs.start_with_threads(ctx, 4, p)
    assert ctx.peak_concurrent_starts() == p
    assert ctx.built_all_before_first_start()
    assert sorted(ctx.start_order()) == [0, 1, 2, 3]
    ctx.close()


def test_context_is_a_real_context():
    from multiprocessing.context import BaseContext

    for method in ("spawn", "forkserver", "fork"):
        ctx = InstrumentedContext(method)
        assert isinstance(ctx, BaseContext)
        assert ctx.get_start_method() == method
        ctx.close()


def test_child_boot_and_ready_are_recorded():
    ctx = InstrumentedContext("spawn", num_workers=2)
    progs.start_with_threads(ctx, 2, 2)
    recs = ctx.records(0)
    assert all(r.boot and r.ready and r.pid and r.exitcode == 0 for r in recs)
    assert all(r.start_begin <= r.start_end for r in recs)
    ctx.close()


def test_wait_booted_returns_once_every_started_worker_runs():
    """The state a held error is released at: every started worker booted (or ended). Right
    after spawn's ``start()`` returns a worker is still booting (an interpreter's start is
    milliseconds at least); waited for, none is, and each has its ``ready``."""
    ctx = InstrumentedContext("spawn", num_workers=2)
    procs = [ctx.Process(target=progs.sleeper, args=(30.0,)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        assert ctx.wait_booted(0.0) == [0, 1]
        assert ctx.wait_booted(120.0) == []
        assert all(r.ready is not None for r in ctx.records(0))
        procs[0].kill()
        procs[0].join()
        assert ctx.wait_booted(0.0) == []  # an ended worker is not waited for
    finally:
        for p in procs:
            p.kill()
            p.join()
        ctx.close()


@pytest.mark.parametrize("position, worker", [("first", 0), ("middle", 1), ("last", 2)])
def test_start_error_fires_at_worker_k_only(position, worker):
    from pytest_workerstart.probes.faults import position_to_worker

    k = position_to_worker(position, 3)
    assert k == worker
    ctx = InstrumentedContext("fork", num_workers=3, faults=FaultPlan.start_error(k))
    procs = [ctx.Process(target=progs.quick) for _ in range(3)]
    failed = []
    for i, pr in enumerate(procs):
        try:
            pr.start()
        except InjectedStartError:
            failed.append(i)
    for pr in procs:
        if pr.pid is not None:
            pr.join()
    assert failed == [k]
    ctx.close()


@pytest.mark.parametrize("kind, code", [("child_exit", 3), ("child_kill", -9)])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_child_faults_fire_at_worker_k_only(kind, code, method):
    ctx = InstrumentedContext(method, num_workers=3, faults=getattr(FaultPlan, kind)(1))
    procs = progs.start_with_threads(ctx, 3, 3)
    assert [p.exitcode for p in procs] == [0, code, 0]
    ctx.close()


def test_child_hang_fires_at_worker_k_only():
    ctx = InstrumentedContext("fork", num_workers=2, faults=FaultPlan.child_hang(0))
    procs = [ctx.Process(target=progs.quick, daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    procs[1].join(10)
    procs[0].join(1)
    assert procs[1].exitcode == 0 and procs[0].exitcode is None
    procs[0].kill()
    procs[0].join()
    ctx.close()


def test_start_delay_reverses_finish_order():
    ctx = InstrumentedContext("fork", num_workers=3, faults=FaultPlan.reverse_finish(3, step=0.3))
    progs.start_with_threads(ctx, 3, 3)
    assert ctx.start_order() == [2, 1, 0]
    ctx.close()


def test_worker_init_fault_targets_one_worker(tmp_path):
    fn = FaultPlan.worker_init_fn(2, once_path=str(tmp_path / "once"))
    fn(0)
    fn(1)
    with pytest.raises(RuntimeError, match="worker 2"):
        fn(2)
    fn(2)  # once


# --- digest ------------------------------------------------------------------------


def test_digest_is_canonical_and_sensitive():
    import collections

    import numpy as np
    import torch

    P = collections.namedtuple("P", "a b")
    batch = {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "y": (1, "s", None, 2.5),
             "n": np.arange(3, dtype=np.int16), "p": P(1, [True, b"z"])}
    same = {"p": P(1, [True, b"z"]), "n": np.arange(3, dtype=np.int16), "y": (1, "s", None, 2.5),
            "x": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    assert dg.batch_digest(batch) == dg.batch_digest(same)
    changed = [
        {**batch, "x": batch["x"].to(torch.float64)},
        {**batch, "x": batch["x"].reshape(3, 2)},
        {**batch, "x": batch["x"] + 1},
        {**batch, "y": [1, "s", None, 2.5]},
        {**batch, "n": np.arange(3, dtype=np.int32)},
        {**batch, "y": (True, "s", None, 2.5)},
    ]
    assert len({dg.batch_digest(b) for b in changed} | {dg.batch_digest(batch)}) == len(changed) + 1
    assert dg.batch_digest(batch["x"].t()) == dg.batch_digest(batch["x"].t().contiguous())
    with pytest.raises(TypeError, match="cannot digest"):
        dg.batch_digest(object())


def test_digest_is_stable_across_processes():
    res = run_scenario("tests._mpprograms_digest:digest_of_fixed_batch", timeout=60)
    import tests._mpprograms_digest as m

    assert res.status == "ok", res.details()
    assert res.value == m.digest_of_fixed_batch()


# --- scenario runner ------------------------------------------------------------------


def test_scenario_ok_error_crash():
    assert run_scenario("tests._mpprograms:returns_42", timeout=30).value == 42
    err = run_scenario("tests._mpprograms:raises", timeout=30)
    assert err.status == "error" and "scenario failed on purpose" in err.error
    crash = run_scenario("tests._mpprograms:exits_hard", timeout=30)
    assert crash.status == "crash" and crash.returncode == 7


def test_hanging_scenario_is_killed_and_reported_with_stacks():
    t0 = time.monotonic()
    res = run_scenario("tests._mpprograms:hang_forever", timeout=3)
    assert time.monotonic() - t0 < 15
    assert res.status == "hang"
    assert "hang_forever" in res.stacks and "thread" in res.stacks.lower()


def test_interrupt_fault_fires_at_worker_k_only():
    res = run_scenario("tests._mpprograms:interrupt_at_worker_1", timeout=60)
    assert res.status == "ok", res.details()
    assert res.value == {"outcome": "KeyboardInterrupt", "started": [0]}
