"""The failure paths' waits derive from the run's boot cost, with documented floors,
and a hang scenario whose timeout fired before the healthy workers were ready is
inconclusive, not a verdict: it runs again with twice the timeout.
"""

import sys
import time
import types

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.conformance.failure import child_faults
from pytest_workerstart.harness import driver_death
from pytest_workerstart.probes import leaks


@pytest.mark.parametrize(("boot", "expected"), [(0.0, 5.0), (1.0, 5.0), (2.5, 5.0), (3.4, 6.8), (10.0, 20.0)])
def test_leak_patience_is_two_boots_at_least_five_seconds(boot, expected):
    assert leaks.patience(boot) == pytest.approx(expected)


def test_driver_death_bound_is_the_setting_else_a_poll_plus_the_patience():
    from pytest_workerstart.conformance.failure.test_driver_death import PARENT_POLL_S, _bound

    def env(setting, boot):
        return types.SimpleNamespace(settings=types.SimpleNamespace(driver_death_timeout=setting),
                                     boot_cost=lambda: boot)

    assert _bound(env(23.0, 3.0)) == 23.0
    assert _bound(env(None, 3.0)) == pytest.approx(PARENT_POLL_S + 6.0)
    assert _bound(env(None, 0.5)) == pytest.approx(PARENT_POLL_S + leaks.PATIENCE_FLOOR_S)


def _run(monkeypatch, outcomes):
    """scenario_child_fault with each try's outcome scripted; returns (result, timeouts tried)."""
    tried = []

    def once(under_test, context, fault, worker, num_workers, parallelism, loader_timeout, boot_cost, before, at):
        tried.append(loader_timeout)
        return dict(outcomes[len(tried) - 1], loader_timeout=loader_timeout)

    monkeypatch.setattr(scenarios, "rebuild", lambda loader, context: object())
    monkeypatch.setattr(child_faults, "_child_fault_once", once)
    monkeypatch.setattr(leaks.LeakSnapshot, "take", classmethod(lambda cls: None))
    out = child_faults.scenario_child_fault({}, "forkserver", "child_hang", worker=1, num_workers=3, parallelism=3,
                                         loader_timeout=5, boot_cost=1.0)
    (state,) = out["states"]
    assert state["at"] is None  # a hang has no state: it never ends
    return state, tried


BOOTING = {"raised": True, "healthy_still_booting": True, "live_while_held": "", "leaks": ""}
JUDGED = {"raised": True, "healthy_still_booting": False, "live_while_held": "", "leaks": ""}


def test_a_timeout_before_the_healthy_workers_were_ready_runs_again_with_twice_the_timeout(monkeypatch):
    out, tried = _run(monkeypatch, [BOOTING, BOOTING, JUDGED])
    assert tried == [5, 10, 20] and out["tries"] == 3 and out["loader_timeout"] == 20
    assert "healthy_still_booting" not in out


def test_a_judged_try_ends_the_scenario(monkeypatch):
    out, tried = _run(monkeypatch, [JUDGED, BOOTING])
    assert tried == [5] and out["tries"] == 1


def test_tries_are_bounded_and_the_last_is_judged(monkeypatch):
    out, tried = _run(monkeypatch, [BOOTING] * child_faults.HANG_TRIES)
    assert len(tried) == child_faults.HANG_TRIES and out["tries"] == child_faults.HANG_TRIES


def test_an_inconclusive_try_that_leaked_is_judged_on_its_leak(monkeypatch):
    out, tried = _run(monkeypatch, [dict(BOOTING, live_while_held="pid 1 alive"), JUDGED])
    assert tried == [5] and out["live_while_held"]


class _SlowToRelease:
    """An error whose release (a stand-in for the loader's shutdown) takes ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def release(self):
        import time

        time.sleep(self.seconds)


def _env(monkeypatch):
    from pytest_workerstart.checkenv import CheckEnv

    monkeypatch.setattr(leaks, "PATIENCE_FLOOR_S", 0.5)  # the bound, shortened for the test
    settings = types.SimpleNamespace(memory_limit=None)
    return CheckEnv("fork", None, settings, None, step_timeout=lambda n: 60.0, boot_cost=lambda: 0.0)


def test_releasing_an_error_is_bounded_by_the_patience_and_names_the_step(monkeypatch):
    import time

    from pytest_workerstart.checkenv import RELEASE_STEP
    from pytest_workerstart.probes.deadline import StepTimeout

    env = _env(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(StepTimeout, match=RELEASE_STEP) as got:
        env.release_held(_SlowToRelease(30), num_workers=2)
    assert time.monotonic() - t0 < 5 and got.value.seconds == pytest.approx(0.5)
    # the patience bounds it, not a step deadline: the circuit breaker does not count it
    assert env.last_step_error is None and env.failure_signature(got.value) is None
    env.release_held(_SlowToRelease(0.0), num_workers=2)  # within the bound: nothing to say


class _ReleaseSeesBoots:
    """An error whose release notes which started workers had not yet begun to run."""

    def __init__(self, ctx):
        self.ctx, self.booting = ctx, None

    def release(self):
        self.booting = [r.worker for r in self.ctx.records() if r.start_end is not None and r.ready is None]


def test_a_held_error_is_released_once_the_started_workers_have_booted(monkeypatch):
    """Released while a spawn worker still unpickles its queues, a loader's shutdown may find that
    worker dead of the unlinked semaphores and end differently (a race in the loader's start):
    the release waits for every started worker to run."""
    from tests import _mpprograms as progs

    env = _env(monkeypatch)
    ctx = env.context(2, method="spawn")
    procs = [ctx.Process(target=progs.sleeper, args=(30.0,)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        held = _ReleaseSeesBoots(ctx)
        env.release_held(held, num_workers=2, ctx=ctx)
        assert held.booting == []
    finally:
        for p in procs:
            p.kill()
            p.join()
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("torch_process_state")
@pytest.mark.parametrize("stalls", [True, False])
def test_a_release_that_waits_out_a_join_is_caught_however_long_its_bound(monkeypatch, stalls):
    """torch's own shutdown after a worker_init_fn error (the stall of StallsReleasingWorkerErrors:
    each join waits 5 s, then the worker is terminated) fails the release even where the wall-time
    bound is far above it (a busy machine's); the reference's release, which ends its workers, passes."""
    from torch.utils.data import DataLoader

    from pytest_workerstart.checkenv import CheckEnv, HeldException
    from pytest_workerstart.datasets import WorkerTagDataset
    from pytest_workerstart.probes.faults import FaultPlan
    from pytest_workerstart.reference import ParallelStartDataLoader

    monkeypatch.setattr(leaks, "PATIENCE_FLOOR_S", 60.0)  # what a busy machine's boot cost makes it
    env = CheckEnv("fork", None, types.SimpleNamespace(memory_limit=None), None, step_timeout=lambda n: 60.0,
                   boot_cost=lambda: 0.0)
    ctx = env.context(2)
    loader = (DataLoader if stalls else ParallelStartDataLoader)(
        WorkerTagDataset(8), num_workers=2, multiprocessing_context=ctx, worker_init_fn=FaultPlan.worker_init_fn(1))
    try:
        for _ in loader:
            pass
    except Exception as exc:
        held = HeldException(exc)
        del exc
    try:
        if stalls:
            with pytest.raises(pytest.fail.Exception, match=r"ended worker.* by a signal.*join's 5 s timeout"):
                env.release_held(held, num_workers=2, ctx=ctx)
        else:
            env.release_held(held, num_workers=2, ctx=ctx)
    finally:
        env.close()


@pytest.mark.parametrize("orphan", ["busy", "idle"])
def test_past_the_driver_death_bound_only_what_still_exits_is_waited_for(orphan):
    """The bound is not the judgement: a child that noticed its driver died and is still exiting
    (using CPU) at the bound is watched on and exits on its own; one that makes no progress is a
    survivor, judged one progress window after the bound, not at the last of its 3 bounds."""
    bound = 2.0  # busy exits 4 s after the driver: between the bound and 3 bounds
    t0 = time.monotonic()
    res = driver_death.run_driver_death("tests._mpprograms:driver_with_orphan", {"orphan": orphan},
                                        exit_mode="sigkill", bound=bound, env=scenarios.child_env())
    took = time.monotonic() - t0
    assert res.setup_error is None, res.setup_error
    if orphan == "busy":
        assert res.ok and res.gone_after_s > bound, (res.report(), res.gone_after_s)
    else:
        assert not res.ok and [i.cmdline for i, _ in res.survivors] == [
            f"{sys.executable} -c import time\ntime.sleep(600)\n"], res.report()
        assert res.gone_after_s is None
        assert took < 30, f"a survivor that makes no progress was watched for {took:.0f} s"
