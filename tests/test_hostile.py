"""A loader that hangs or crashes gets a verdict in minutes: the preflight, the
per-step deadlines and the circuit breaker (fixtures/broken/hostile.py)."""

import os
import time

import psutil
import pytest

from pytest_workerstart.probes.shm import ShmWatch, attributed_shm

pytestmark = pytest.mark.slow
MODULE = "pytest_workerstart.fixtures.broken.hostile"
LIMIT_S = 300


#: Set for every suite run of this module: a leftover is a process that inherited
#: it, never another job's process that merely looks alike.
TAG = "WORKERSTART_SELFTEST_RUN"


@pytest.fixture(autouse=True)
def _tagged(monkeypatch):
    monkeypatch.setenv(TAG, f"{os.getpid()}-{time.monotonic_ns()}")


@pytest.fixture(autouse=True)
def shm_watch():
    """The /dev/shm entries this test's process tree creates (inotify-woken samples of the tree):
    only those can be its leftovers, whatever other jobs, or xdist workers, create meanwhile."""
    with ShmWatch() as watch:
        yield watch


def _leftovers(watch: ShmWatch):
    """Processes of this test's runs (tagged, not ours) and /dev/shm entries our tree created
    that still exist and nobody maps any more."""
    tag = os.environ[TAG]
    ours = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] in ours:
            continue
        try:
            if p.environ().get(TAG) != tag:
                continue
        except psutil.Error:
            continue
        procs.append(f"pid {p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
    created = set(watch.left())
    live = attributed_shm(p.pid for p in psutil.process_iter()) if created else set()
    return procs, sorted(created - live)


# The step timeout bounds the preflight: 15 s keeps the hangs' runs short; a crash must be
# reported as a crash however long the spawn workers take to boot under load, so those get 60 s
# (the crash ends the preflight at once: the bound is never waited out).
@pytest.mark.parametrize("name, expect, step_timeout", [
    ("HangsAtFirstBatch", "it hung", 15),
    ("HangsInIter", "it hung", 15),
    ("SegfaultsInIter", "killed by signal 11", 60),
    ("SegfaultsInWorker", "DataLoader worker", 60),
])
def test_preflight_gives_a_verdict(run_suite, shm_watch, name, expect, step_timeout):
    t0 = time.monotonic()
    v = run_suite(f"--workerstart-loader={MODULE}:{name}", "--workerstart-profile=quick",
                  f"--workerstart-step-timeout={step_timeout}", timeout=LIMIT_S)
    took = time.monotonic() - t0
    out = v.result.stdout.str() + v.result.stderr.str()
    assert v.result.ret == 4, out[-3000:]
    assert took < LIMIT_S
    data = v.data
    assert data["complete"] is False and data["summary"]["passed"] == 0
    assert data["summary"]["not_run"] == len(data["checks"]) > 0
    assert all("preflight" in c["reason"] and expect in c["reason"] for c in data["checks"]), data["checks"][0]
    # at most 5 lines: what failed, where, the fix, and no table of checks that never ran
    after_header = out[out.index("collected"):]
    ours = [ln for ln in after_header.splitlines() if "workerstart" in ln]
    assert len(ours) <= 5 and "not run" not in out, out[-3000:]
    assert "preflight failed" in ours[0] and expect in ours[1] and "adapter.md" in ours[-2], out[-3000:]
    time.sleep(1.0)
    procs, shm = _leftovers(shm_watch)
    assert not procs and not shm, f"left behind: {procs} {shm}"


def test_deadlines_and_circuit_breaker(run_suite, shm_watch):
    """Passes the preflight, then hangs in every check with 3 workers: each such check
    fails at its deadline with stacks; after 3 in a row the rest are reported not run."""
    t0 = time.monotonic()
    v = run_suite(f"--workerstart-loader={MODULE}:HangsWithThreeWorkers", "--workerstart-profile=quick",
                  "--workerstart-context=forkserver", "--workerstart-step-timeout=30", "--tb=short",
                  timeout=LIMIT_S)  # the stacks are in the tracebacks, shown only when asked for
    took = time.monotonic() - t0
    out = v.result.stdout.str()
    data = v.data
    assert took < LIMIT_S and data["complete"] is False
    hung = [c for c in data["checks"] if c["state"] == "finished" and c["outcome"] == "failed"]
    assert len(hung) == 3 and all("the loader hung: next() #1 did not return within 30 s" in c["reason"]
                                  for c in hung), data["checks"]
    rest = [c for c in data["checks"] if c["state"] != "finished"]
    assert rest and all("circuit breaker" in c["reason"] for c in rest), rest[:2]
    assert "driver thread MainThread" in out and "--- worker 0 (pid" in out, out[-4000:]
    assert "circuit breaker: the loader failed the same way (hang at next() #1) in 3 checks in a row" in out
    time.sleep(1.0)
    procs, shm = _leftovers(shm_watch)
    assert not procs and not shm, f"left behind: {procs} {shm}"


def test_crash_mid_session_is_contained_under_xdist(run_suite, pytester):
    """A loader that passes the preflight and crashes the driver later costs one check under -n 1."""
    pytester.makepyfile(crashes_later="""
        import os
        from torch.utils.data import DataLoader

        class CrashesWithThreeWorkers(DataLoader):
            def __iter__(self):
                if self.num_workers >= 3:
                    os._exit(139)  # the process driving the loader dies
                return super().__iter__()
    """)
    v = run_suite("--workerstart-loader=crashes_later:CrashesWithThreeWorkers", "--workerstart-context=forkserver",
                  "--workerstart-profile=quick",
                  "-k", "(order.registration or persistent.reuse or transfer.shared_memory) and not _at",
                  "-p", "xdist", "-n", "1", timeout=LIMIT_S)
    data = v.data
    outcomes = {c["id"]: (c["outcome"], c["reason"]) for c in data["checks"]}
    assert outcomes["order.registration"][0] == "error" and "crashed" in outcomes["order.registration"][1], outcomes
    assert outcomes["persistent.reuse"][0] == outcomes["transfer.shared_memory"][0] == "passed", outcomes  # went on
    assert data["complete"] is True, data["summary"]


def test_memory_guard_stops_a_runaway_loader(run_suite, shm_watch):
    """A loader that allocates without bound is stopped at the limit, at the
    preflight (exit 4) and inside a check (failed, with the numbers), not the machine."""
    t0 = time.monotonic()
    spec = f"--workerstart-loader={MODULE}:EatsMemoryAtFirstBatch"
    v = run_suite(spec, "--workerstart-context=forkserver", "--workerstart-memory-limit=3", "-k", "default_serial",
                  timeout=LIMIT_S)
    out = v.result.stdout.str()
    assert v.result.ret == 4, out[-3000:]
    line = next(ln for ln in out.splitlines() if "workerstart: preflight:" in ln)
    assert "ran away with memory" in line and "over the 3.0 GiB limit" in line, line
    v = run_suite(spec, "--workerstart-context=forkserver", "--workerstart-memory-limit=3", "-k", "default_serial",
                  "--workerstart-preflight=false", timeout=LIMIT_S)
    (reason,) = v.reasons("start.default_serial")
    assert v.outcomes("start.default_serial") == ["failed"]
    assert "over the 3.0 GiB limit (--workerstart-memory-limit)" in reason, reason
    assert time.monotonic() - t0 < LIMIT_S
    assert _leftovers(shm_watch) == ([], [])


def test_a_shutdown_that_hangs_fails_at_its_bound(run_suite, shm_watch):
    """Batches come as torch's do, but releasing an iterator that served two hangs: each check that
    releases one fails at the step bound naming the shutdown (never passes), then the breaker stops the run."""
    t0 = time.monotonic()
    v = run_suite(f"--workerstart-loader={MODULE}:HangsAtShutdown", "--workerstart-profile=quick",
                  "--workerstart-context=fork", "--workerstart-step-timeout=15",
                  "-k", "order.registration or start.default_serial or digest.torch_parity or persistent.reuse",
                  timeout=LIMIT_S)
    cases = v.data["checks"]
    failed = [c for c in cases if c["outcome"] == "failed"]
    assert len(failed) == 3 and all("the loader hung: the iterator's shutdown did not return within 15 s"
                                    in c["reason"] for c in failed), cases
    assert not [c for c in cases if c["outcome"] == "passed"], cases
    rest = [c for c in cases if c["state"] != "finished"]
    assert rest and all("circuit breaker" in c["reason"] for c in rest), rest
    assert "circuit breaker: the loader failed the same way (hang at the iterator's shutdown)" \
        in v.result.stdout.str()
    assert time.monotonic() - t0 < 150
    time.sleep(1.0)
    assert _leftovers(shm_watch) == ([], [])


def test_a_leaking_loader_stopped_at_its_bound_leaves_nothing(run_suite, shm_watch):
    """Workers that create /dev/shm segments nobody unlinks, and a shutdown after a worker error
    that stalls past the failure patience: in every context the stopped step ends with the
    cleanup of a normal ending, and the reason says what the suite removed. Where a busy
    machine's patience outlasts the stall, the release returns and fails as one that waited out
    its joins; the teardown removes the segments and the case lists them."""
    v = run_suite(f"--workerstart-loader={MODULE}:LeaksShmAndStallsOnError", "--workerstart-profile=full",
                  "--workerstart-preflight=false", "-k", "leaks.shm_segments and worker_error", timeout=LIMIT_S)
    cases = v.data["checks"]
    assert {c["context"] for c in cases} == {"spawn", "forkserver", "fork"}, cases
    assert all(c["outcome"] == "failed" for c in cases), cases
    spawn = next(c for c in cases if c["context"] == "spawn")
    unlinked = (spawn.get("measurements") or {}).get("shm_unlinked_by_suite", [])
    assert ("the suite" in spawn["reason"] and "psm_" in spawn["reason"]) or (
        "by a signal" in spawn["reason"] and any(n.startswith("psm_") for n in unlinked)), spawn
    time.sleep(1.0)
    assert _leftovers(shm_watch) == ([], [])


def test_sigterm_during_a_stalled_release_leaves_nothing(shm_watch, tmp_path):
    """pytest sent SIGTERM while the loader's shutdown after a worker error stalls: the run ends
    as after Ctrl-C, with the step's cleanup, and nothing it created stays in /dev/shm."""
    import json
    import signal
    import subprocess
    import sys

    mark, verdict = tmp_path / "raised", tmp_path / "verdict.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--workerstart",
         f"--workerstart-loader={MODULE}:LeaksShmAndStallsOnError", "--workerstart-profile=quick",
         "--workerstart-context=spawn", "--workerstart-preflight=false", f"--workerstart-json={verdict}",
         "-k", "leaks.shm_segments and worker_error"],
        cwd=tmp_path, env={**os.environ, "WORKERSTART_SELFTEST_ERROR_MARK": str(mark)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), "the loader never raised"
        time.sleep(1.0)  # inside the release that follows (it stalls for 5 s per worker)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (1, 2), out[-3000:]  # failed at the step's bound, or interrupted
    data = json.loads(verdict.read_text())
    assert data["outcome"] != "running", data
    time.sleep(1.0)
    assert _leftovers(shm_watch) == ([], [])


LEAVES_SHM = """
import os
from multiprocessing import resource_tracker, shared_memory

from torch.utils.data import DataLoader


def _leave(worker_id):  # what torch's fd sharing leaves when its worker dies between create and unlink
    open(f"/dev/shm/torch_{os.getpid()}_{os.getpid() % 9973}_{worker_id}", "wb").close()


class LeavesShm(DataLoader):
    held = []

    def __init__(self, dataset, **kwargs):
        kwargs.setdefault("worker_init_fn", _leave)
        super().__init__(dataset, **kwargs)

    def __iter__(self):  # a driver-side segment per iterator, never unlinked, unknown to the tracker
        seg = shared_memory.SharedMemory(create=True, size=4096)
        resource_tracker.unregister(seg._name, "shared_memory")
        self.held.append(seg)
        return super().__iter__()
"""


@pytest.mark.timeout(LIMIT_S)
def test_what_a_passing_check_left_in_dev_shm_is_removed_and_reported(pytester, run_suite, shm_watch):
    """Whatever a check judges, its teardown removes the /dev/shm entries the loader's processes
    created and left (a driver's segment, a torch_<pid> entry named for a worker of the check), and
    the case says so."""
    pytester.makepyfile(leavesshm=LEAVES_SHM)
    v = run_suite("--workerstart-context=fork", "--workerstart-profile=quick", "--workerstart-preflight=false",
                  "-k", "start.default_serial", "--workerstart-loader=leavesshm:LeavesShm")
    (case,) = v.data["checks"]
    assert case["outcome"] == "passed", case
    unlinked = case["measurements"]["shm_unlinked_by_suite"]
    assert any(n.startswith("psm_") for n in unlinked) and any(n.startswith("torch_") for n in unlinked), unlinked
    assert not set(unlinked) & set(os.listdir("/dev/shm"))
    assert _leftovers(shm_watch) == ([], [])
