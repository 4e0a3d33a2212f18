"""The scenario lookahead (pytest_workerstart/harness/lookahead.py).

Consecutive planned checks of one module run side by side, never more than
``jobs`` at once; each check gets its own result; a check that skips, or one in
another module, runs nothing ahead; a drain stops a running scenario and leaves
nothing of it alive.
"""

import functools
import threading
import time
import types

import psutil
import pytest

from pytest_workerstart.harness.lookahead import MARKER, ScenarioLookahead, planned_scenario
from pytest_workerstart.harness.runner import run_scenario
from pytest_workerstart.scenarios import child_env


class Item:
    """What the lookahead reads of a pytest item."""

    def __init__(self, nodeid, parent, plan=None, params=None, marks=()):
        self.nodeid, self.parent = nodeid, parent
        self.callspec = types.SimpleNamespace(params=params or {})
        self._marks = {m.name: m for m in marks}
        if plan is not None:
            self._marks[MARKER] = planned_scenario(plan).mark
        self.session = None

    def get_closest_marker(self, name):
        return self._marks.get(name)


def _session(items):
    session = types.SimpleNamespace(items=items)
    for it in items:
        it.session = session
    return items


class Recorder:
    def __init__(self, seconds=0.4):
        self.seconds, self.lock = seconds, threading.Lock()
        self.running = self.peak = 0
        self.planned: list[int] = []

    def plan(self, env, k):
        self.planned.append(k)
        if k == "skip":
            pytest.skip("this case skips itself")
        return functools.partial(self.work, k)

    def work(self, k):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return f"result of {k}"


def test_consecutive_checks_run_side_by_side_each_with_its_own_result():
    rec = Recorder()
    items = _session([Item(f"m::t[{k}]", "m", rec.plan, {"k": k}) for k in range(6)])
    queue = ScenarioLookahead(2, lambda item: object())
    t0 = time.monotonic()
    try:
        got = [queue.result(it, object()) for it in items]
    finally:
        queue.close()
    elapsed = time.monotonic() - t0
    assert got == [f"result of {k}" for k in range(6)]
    assert rec.peak == 2, f"{rec.peak} scenarios ran at once, jobs=2"
    assert elapsed < 6 * rec.seconds * 0.75, f"six 0.4 s scenarios, two at a time, took {elapsed:.2f} s"


def test_one_job_runs_each_scenario_when_its_check_asks():
    rec = Recorder(seconds=0.05)
    items = _session([Item(f"m::t[{k}]", "m", rec.plan, {"k": k}) for k in range(3)])
    queue = ScenarioLookahead(1, lambda item: object())
    for it in items:
        assert queue.result(it, object()) == f"result of {it.callspec.params['k']}"
        assert rec.planned[-1] == it.callspec.params["k"] and rec.peak == 1
    assert queue._pool is None, "one job needs no thread"


def test_skipping_checks_and_other_modules_run_nothing_ahead():
    rec, other = Recorder(seconds=0.05), Recorder(seconds=0.05)
    items = _session([
        Item("m::t[0]", "m", rec.plan, {"k": 0}),
        Item("m::t[skip]", "m", rec.plan, {"k": "skip"}),
        Item("m::t[marked]", "m", rec.plan, {"k": "marked"}, marks=[pytest.mark.skip(reason="x").mark]),
        Item("m::t[gap]", "m", rec.plan, {"k": "gap"}),
        Item("m::t[1]", "m", rec.plan, {"k": 1}),
        Item("n::t[0]", "n", other.plan, {"k": 0}),
    ])
    queue = ScenarioLookahead(2, lambda item: None if item.nodeid.endswith("[gap]") else object())
    try:
        assert queue.result(items[0], object()) == "result of 0"
        # planned ahead: the next two that will run; the skip tried and dropped; not another module's
        assert rec.planned == [0, "skip", 1] and other.planned == []
        assert not queue.holds(items[1]) and not queue.holds(items[2]) and queue.holds(items[4])
        with pytest.raises(pytest.skip.Exception, match="skips itself"):
            queue.result(items[1], object())
        assert queue.result(items[4], object()) == "result of 1"
    finally:
        queue.close()
    # one loader for every module (--workerstart): the run goes on across them
    rec.planned.clear()
    queue = ScenarioLookahead(2, lambda item: object(), one_loader=True)
    try:
        assert queue.result(items[4], object()) == "result of 1" and queue.holds(items[5])
    finally:
        queue.close()


def test_a_skipped_scenario_check_between_queued_ones_keeps_the_queue():
    """The session drains after a check unless what follows may run beside the queue: a queued
    check, or a scenario check that skips (its own run drains nothing); never an in-process check."""
    rec = Recorder(seconds=0.05)
    in_process = Item("m::t_in_process", "m")
    items = _session([Item("m::t[0]", "m", rec.plan, {"k": 0}), Item("m::t[skip]", "m", rec.plan, {"k": "skip"}),
                      Item("m::t[1]", "m", rec.plan, {"k": 1}), in_process, Item("n::t[0]", "n", rec.plan, {"k": 0})])
    queue = ScenarioLookahead(2, lambda item: object())
    try:
        queue.result(items[0], object())
        assert queue.holds(items[2]) and not queue.holds(items[1])
        assert queue.may_run_beside(items[0], items[1]), "a skipping scenario check drained the queue"
        assert queue.may_run_beside(items[1], items[2])
        assert not queue.may_run_beside(items[2], in_process), "an in-process check ran beside scenarios"
        assert not queue.may_run_beside(items[2], None)
        assert not queue.may_run_beside(items[2], items[4]), "another module's loader ran beside this one's"
        assert ScenarioLookahead(2, lambda item: object(), one_loader=True).may_run_beside(items[2], items[4])
    finally:
        queue.close()


def test_drain_stops_a_running_scenario_and_leaves_nothing():
    def plan(env, k):
        if k == 0:
            return lambda: "first"
        return functools.partial(run_scenario, "tests._mpprograms:sleeper", {"seconds": 120}, timeout=300,
                                 env=child_env())

    items = _session([Item(f"m::t[{k}]", "m", plan, {"k": k}) for k in range(2)])
    queue = ScenarioLookahead(2, lambda item: object())
    assert queue.result(items[0], object()) == "first"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _sleepers():
        time.sleep(0.1)
    assert _sleepers(), "the scenario planned ahead never started"
    t0 = time.monotonic()
    queue.close()
    assert time.monotonic() - t0 < 15, "draining took longer than killing one scenario should"
    assert not _sleepers(), "the drained scenario is still alive"


def _sleepers():
    """Scenario interpreters below this process, not the zygote (``harness.runner --zygote``)
    that an earlier test in this xdist worker may have left running."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
            if "pytest_workerstart.harness.runner" in cmd and "--zygote" not in cmd:
                out.append(p)
        except psutil.Error:
            continue
    return out
