"""A worker's death during start is placed at states the suite reaches by synchronisation
(``probes.faults.DEATH_STATES``), so the child-fault checks judge the same thing every run:
the probe places it (a fork child's death seen before ``start()`` returns, before a put, only
after the driver waits), and the check sweeps the states, naming the one a loader fails in."""

import queue
import time

import pytest

from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.faults import FaultPlan, is_dead

from . import _mpprograms as progs

FORK_FULL = ("--workerstart-context=fork", "--workerstart-profile=full", "-k", "child_exit_during_start")


def _started(at):
    ctx = InstrumentedContext("fork", num_workers=1, faults=FaultPlan.child_exit(0, at=at))
    q = ctx.Queue()
    proc = ctx.Process(target=progs.quick, daemon=True)
    proc.start()
    return ctx, q, proc


def test_in_start_returns_from_start_once_the_worker_is_dead():
    ctx, q, proc = _started("in_start")
    assert is_dead(proc.pid)
    proc.join(5)
    assert proc.exitcode == 3 and ctx.records(0)[0].death_placed is True
    ctx.close()


def test_before_send_holds_the_next_put_until_the_worker_is_dead():
    ctx, q, proc = _started("before_send")
    q.put(1)
    assert is_dead(proc.pid) and ctx.records(0)[0].death_placed is True
    proc.join(5)
    q.close()
    ctx.close()


def test_while_waiting_dies_only_once_the_driver_waits_after_sending():
    ctx, q, proc = _started("while_waiting")
    time.sleep(0.3)
    q.put(1)
    time.sleep(0.3)
    assert not is_dead(proc.pid), "died before the driver waited for a result"
    assert q.get(timeout=5) == 1  # the driver's first get after its put opens the gate
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)
    proc.join(5)
    assert proc.exitcode == 3 and ctx.records(0)[0].death_placed is True
    q.close()
    ctx.close()


def test_a_context_without_queue_placed_deaths_hands_out_plain_queues():
    for plan in (FaultPlan(), FaultPlan.child_exit(0), FaultPlan.child_exit(0, at="in_start")):
        ctx = InstrumentedContext("fork", num_workers=1, faults=plan)
        assert type(ctx.Queue()).__name__ == "Queue"
        ctx.close()


def test_an_unknown_state_is_refused():
    with pytest.raises(ValueError, match="unknown death state 'later'"):
        FaultPlan.child_kill(0, at="later")


def _states(verdict):
    (case,) = [c for c in verdict.data["checks"] if c["id"] == "failure.child_exit_during_start"]
    return {state: outcome.partition(":")[0] for state, outcome in case["measurements"]["states"].items()}


def test_the_check_names_the_state_a_loader_fails_in(run_suite):
    """Checks its workers only as iter() returns: a death before then is reported, one once it
    waits for data is not."""
    v = run_suite(*FORK_FULL, "--workerstart-loader=pytest_workerstart.fixtures.broken.loaders:ChecksWorkersOnlyInIter")
    assert _states(v) == {"in_start": "passed", "before_send": "passed", "while_waiting": "failed"}
    (reason,) = v.reasons("failure.child_exit_during_start")
    assert reason.startswith("Failed: at while_waiting (worker 1 died once the driver, having sent work, waited")


def test_torchs_outcome_is_the_same_at_each_state(run_suite):
    """torch keeps the half-built or failed iterator, and with it the surviving workers, while
    the error is held, at every state (and at `in_start` and `while_waiting` its index queues'
    feeder threads): placed, each state gives that outcome every run, where an unplaced death
    passed or failed by the machine's timing."""
    for _ in range(2):
        v = run_suite(*FORK_FULL, "--workerstart-loader=torch")
        assert _states(v) == {"in_start": "failed", "before_send": "failed", "while_waiting": "failed"}
        (reason,) = v.reasons("failure.child_exit_during_start")
        assert reason.startswith("Failed: at in_start"), reason
