"""Isolation: the suite never harms, or is harmed by, what runs beside it.

* a neighbour's named semaphores are neither counted nor unlinked (a churner
  creates and unlinks them beside two runs at once);
* killing pytest (SIGINT, SIGTERM, SIGKILL) mid-scenario leaves nothing of the
  scenario alive after 15 s (the guard in harness/reaper.py);
* two suite runs at once, beside a semaphore-churning process, each get the
  verdict a run alone gets, and the churner never loses a semaphore;
* ``-n 2`` (xdist) gives the plain run's verdict;
* a run in a process that already has children (``pytest.main`` from a program) ends none of them.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_workerstart.harness import reaper
from tests._interruptible import PYTEST
from tests._mpprograms import SemaphoreChurner
from tests.conftest import NO_HYPOTHESIS_PLUGIN

FAST = ("--workerstart-context=forkserver", "--workerstart-profile=quick")
#: Checks that count semaphores/shm or kill and unlink (the ones a neighbour could fool).
ISOLATION_IDS = ("leaks.clean_exit", "failure.interrupt_during_start", "failure.driver_killed",
                 "failure.parent_start_error", "digest.first_batch", "leaks.shm_segments")
K = " or ".join(ISOLATION_IDS)


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _watch_tree(proc: subprocess.Popen, until, timeout: float = 180) -> dict:
    """Record ``proc``'s descendants until ``until(live processes)`` or ``timeout``."""
    me = psutil.Process(proc.pid)
    seen: dict = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            for p in me.children(recursive=True):
                seen[p] = p  # a psutil.Process hashes by pid and start since boot
        except psutil.Error:
            break
        live = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if until(live):
            return seen
        time.sleep(0.2)
    output = proc.stdout.read()[-3000:] if proc.poll() is not None else ""
    pytest.fail(f"the scenario never got going; pytest output:\n{output}")


@pytest.mark.suite  # a pytest of its own, killed mid-scenario
@pytest.mark.parametrize("sig, group", [("SIGINT", False), ("SIGTERM", True), ("SIGKILL", False)],
                         ids=["sigint", "sigterm-group", "sigkill"])
def test_killed_pytest_leaves_nothing(tmp_path, sig, group):
    """A scenario whose worker hangs mid-start (spawn; the loader ignores timeout=, so
    it stays there): scenario driver, spawn workers and its resource tracker."""
    proc = subprocess.Popen([*PYTEST, "--workerstart", "-p", "no:cacheprovider", "-q",
                             "--workerstart-context=spawn", "-k", "child_hang_during_start",
                             "--workerstart-loader=pytest_workerstart.fixtures.broken.loaders:IgnoresTimeout"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        # the scenario driver, its tracker and three spawn workers
        seen = _watch_tree(proc, lambda live: sum("harness.runner" in _cmd(p) for p in live) >= 1
                           and sum("multiprocessing" in _cmd(p) for p in live) >= 4)
        time.sleep(1.0)
        for p in psutil.Process(proc.pid).children(recursive=True):
            seen[p] = p  # a psutil.Process hashes by pid and start since boot
        # a fresh scenario interpreter names DIR/request.json; one forked by the zygote writes DIR/stderr.txt
        workdirs = set().union(*(reaper.scenario_workdir(p) for p in seen.values()))
        if group:
            os.killpg(proc.pid, getattr(signal, sig))
        else:
            proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=120)
        _, alive = psutil.wait_procs(list(seen.values()), timeout=15)
        left = sorted(d for d in workdirs if os.path.exists(d))
        survivors = [(p.pid, _cmd(p)[:120]) for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert len(seen) >= 3, f"expected a scenario tree, saw {[(_cmd(p)[:80]) for p in seen.values()]}"
    assert not survivors, f"alive 15 s after {sig} of pytest: {survivors}\n{out[-2000:]}"
    # the scenario's private directory (its TMPDIR: forkserver sockets, event logs) goes too
    assert workdirs and not left, f"left in the temp directory after {sig} of pytest: {left or 'no workdir seen'}"


def _verdict_map(verdict):
    return {(c["id"], c["context"], c["nodeid"].split("[", 1)[-1]): c["outcome"] for c in verdict.data["checks"]}


_ALONE: dict[str, dict] = {}


def _alone(run_suite) -> dict:
    """The verdict of K run alone, once per module (the tests below compare with it)."""
    if "map" not in _ALONE:
        alone = run_suite(*FAST, "-k", K)
        assert alone.data["complete"] and alone.failed_ids() == set(), alone.result.stdout.str()[-3000:]
        _ALONE["map"] = _verdict_map(alone)
    return _ALONE["map"]


def test_two_runs_at_once_beside_a_churner(run_suite, tmp_path, pytester):
    """Both runs get the verdict a run alone gets, and the churner never loses a semaphore."""
    alone = _alone(run_suite)
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    out2 = second_dir / "verdict.json"
    with SemaphoreChurner(tmp_path / "churn.json") as churner:
        other = subprocess.Popen([sys.executable, "-m", "pytest", "--workerstart", "-p", "no:cacheprovider",
                                  *NO_HYPOTHESIS_PLUGIN, *FAST,
                                  "-k", K, f"--workerstart-json={out2}"], cwd=second_dir,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = run_suite(*FAST, "-k", K)
        second_out, _ = other.communicate(timeout=900)
    from tests.conftest import Verdict

    second = Verdict(out2, None)
    assert _verdict_map(first) == alone, first.result.stdout.str()[-3000:]
    assert _verdict_map(second) == alone, second_out[-3000:]
    assert churner.report["created"] > 100, churner.report
    assert churner.report["lost"] == 0, f"a suite run unlinked a neighbour's semaphores: {churner.report}"


def test_xdist_gives_the_plain_verdict(run_suite):
    plain = _alone(run_suite)
    dist = run_suite(*FAST, "-k", K, "-p", "xdist", "-n", "2")
    assert dist.data["complete"], dist.result.stdout.str()[-3000:]
    assert _verdict_map(dist) == plain, dist.result.stdout.str()[-3000:]


def test_interrupt_check_holds_when_sigint_is_inherited_ignored(run_suite):
    """A background job of a script (and nohup, some CI runners) starts with SIGINT
    ignored, and Python keeps it so: the Ctrl-C check must still see its
    KeyboardInterrupt (it got "nothing" there before the scenario reset the handler)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        v = run_suite(*FAST, "-k", "interrupt_during_start")
    finally:
        signal.signal(signal.SIGINT, old)
    assert v.outcomes("failure.interrupt_during_start") == ["passed"], v.reasons("failure.interrupt_during_start")


def test_workers_ended_by_the_suite_leave_no_folder_in_the_temp_directory(run_suite):
    """torch's workers open a listener socket in their multiprocessing temp folder to pass file
    descriptors; a worker that is killed (here torch's shutdown after a worker_init_fn error
    terminates its workers once their joins time out, or the suite stops them at the release's
    bound, which grows with the boot cost) never removes a folder of its own. They share pytest's,
    which goes when pytest exits: nothing is left in TMPDIR (this test's own, see conftest)."""
    tmp = Path(os.environ["TMPDIR"])
    v = run_suite("--workerstart-context=fork", "--workerstart-loader=torch", "--workerstart-preflight=false",
                  "-k", "test_retry_after_failure and worker_init_error")
    (reason,) = v.reasons("failure.retry_after_failure")
    assert "did not return within" in reason or "by a signal" in reason, v.result.stdout.str()[-3000:]
    assert sorted(p.name for p in tmp.glob("pymp-*")) == []


#: a process that lets SIGTERM end it as Ctrl-C does, then forks: the child is SIGTERMed at once
_FORKED_CHILD = """
import os, signal, sys, time
from pytest_workerstart.harness import reaper

reaper.terminate_as_interrupt()
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.write(ready_w, b"x")
        time.sleep(30)
    except reaper.Terminated:
        os._exit(3)  # it unwound through the parent's frames, as a second pytest would
    os._exit(0)
os.read(ready_r, 1)
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_of_pytest_sent_sigterm_dies_and_does_not_unwind_as_pytest():
    """A fork worker SIGTERMed before it sets its own handlers (the suite's cleanup, a loader's
    terminate()) inherits pytest's SIGTERM handler: it must die, not raise into pytest's frames
    and run a second pytest session that writes its summary into the run's output."""
    proc = subprocess.run([sys.executable, "-c", _FORKED_CHILD], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(-signal.SIGTERM), proc.stdout + proc.stderr[-2000:]


def test_a_run_inside_a_process_leaves_that_processs_own_children_alone(tmp_path, monkeypatch):
    """``pytest.main`` from a program (a notebook, a script with its own workers): the session's
    end and its guard kill what the session started, never the children the program already had
    (the self-tests' warm pytest server was one: a documented command collected in-process ended it)."""
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        monkeypatch.chdir(tmp_path)
        assert pytest.main(["-p", "no:cacheprovider", "-q", "--collect-only", "--workerstart",
                            "--workerstart-preflight=false", "-k", "start.default_serial"]) == 0
        assert mine.poll() is None, "the run ended a child it did not start"
        guard = reaper.start_guard()
        during = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        try:
            assert reaper.reap_session() and during.wait(10) is not None, "what the session started is ended"
            assert mine.poll() is None
        finally:
            reaper.stop_guard()
            during.kill()
            during.wait()
        assert guard.poll() is not None
    finally:
        mine.kill()
        mine.wait()
