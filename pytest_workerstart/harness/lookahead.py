"""Scenarios of consecutive checks, run up to ``jobs`` at a time.

A check whose whole work is one fresh-interpreter scenario declares how to
start it, ``@planned_scenario(plan)`` with ``plan(check_env, **params)``
returning a zero-argument callable (or skipping), and gets its result from
``check_env.scenario_result()``. When the first of a run of such checks
(consecutive in pytest's order; within one module when checks are embedded in a
project's tests, whose modules may judge different loaders) asks for its result, the plans of the
checks that follow it are made too and queued: ``jobs`` scenarios run at once
and each check judges its own result when pytest reaches it. Most of a
scenario's time is a fresh interpreter importing torch and its workers booting,
so two at a time on two cores end the run of checks well before one at a time.

Only correctness scenarios come here: their bounds scale with measured boot
cost, never with the machine's speed; the speed clause's trials always run
alone. Before any check that is not a scenario check runs, the queue is drained:
running scenarios are stopped (their trees killed by the runner) and the rest
dropped, so no scenario overlaps an in-process check, its leak snapshots or another
module's loader (a skipped scenario check between two queued ones drains nothing).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pytest_workerstart.harness.runner import ABORT, ScenarioAborted

MARKER = "workerstart_scenario"


def planned_scenario(plan: Callable[..., Callable[[], Any]]) -> pytest.MarkDecorator:
    """Decorate a check whose work is the scenario ``plan(check_env, **params)`` returns."""
    # with_args: a lone callable argument would otherwise be taken as the decorated function
    return getattr(pytest.mark, MARKER).with_args(plan)


def plan_of(item: pytest.Item) -> Callable[..., Callable[[], Any]] | None:
    marker = item.get_closest_marker(MARKER)
    return marker.args[0] if marker is not None else None


def _params(item: pytest.Item, plan: Callable) -> dict[str, Any]:
    names = inspect.signature(plan).parameters
    given = item.callspec.params if hasattr(item, "callspec") else {}
    return {k: v for k, v in given.items() if k in names}


def run_now(item: pytest.Item, env: Any) -> Any:
    """Plan and run ``item``'s scenario here, without a queue."""
    plan = plan_of(item)
    return plan(env, **_params(item, plan))()


class ScenarioLookahead:
    """The queue of one session. ``env_for(item)``: the CheckEnv a later item will
    get, or None if it will be skipped for a requirement the loader lacks."""

    def __init__(self, jobs: int, env_for: Callable[[pytest.Item], Any], one_loader: bool = False):
        self.jobs = jobs
        #: every module judges the same loader (``--workerstart``; embedded, a module's
        #: ``workerstart_loader`` fixture may differ), so a run of checks may cross modules
        self.one_loader = one_loader
        self._env_for = env_for
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._abort = threading.Event()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._index: dict[str, int] = {}

    def result(self, item: pytest.Item, env: Any) -> Any:
        """The scenario result of ``item``: run ahead while an earlier check ran, or now."""
        future = self._futures.pop(item.nodeid, None)
        if future is None:
            if self.jobs <= 1:
                return run_now(item, env)
            plan = plan_of(item)
            future = self._submit(plan(env, **_params(item, plan)))  # a skip propagates to the check
            self._plan_following(item)
        return self._wait(future)

    def _wait(self, future: concurrent.futures.Future) -> Any:
        try:
            while True:
                try:
                    return future.result(timeout=0.2)  # short waits: Ctrl-C and pytest-timeout get through
                except concurrent.futures.TimeoutError:
                    continue
        except BaseException:
            self.drain(future)
            raise

    def holds(self, item: pytest.Item | None) -> bool:
        return item is not None and item.nodeid in self._futures

    def may_run_beside(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        """Whether what runs ahead may go on while ``nextitem`` runs after ``item``: it is one of
        the queued checks, or another scenario check of the run (one that skips, or plans its own)."""
        if nextitem is None:
            return False
        if self.holds(nextitem):
            return True
        return plan_of(nextitem) is not None and (self.one_loader or nextitem.parent is item.parent)

    def drain(self, *also: concurrent.futures.Future) -> None:
        """Stop what runs, drop what waits; returns once no scenario of the queue is alive."""
        futures, self._futures = [*self._futures.values(), *also], {}
        if not futures:
            return
        self._abort.set()
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)
        self._abort = threading.Event()

    def close(self) -> None:
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # --- internals -------------------------------------------------------------
    def _submit(self, call: Callable[[], Any]) -> concurrent.futures.Future:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.jobs, thread_name_prefix="workerstart-scenario")
        abort = self._abort

        def run() -> Any:
            if abort.is_set():
                raise ScenarioAborted("dropped before it started")
            ABORT.set(abort)
            return call()

        return self._pool.submit(run)

    def _plan_following(self, item: pytest.Item) -> None:
        items = item.session.items
        if not self._index:
            self._index = {it.nodeid: i for i, it in enumerate(items)}
        start = self._index.get(item.nodeid)
        if start is None:
            return
        for nxt in items[start + 1:]:
            plan = plan_of(nxt)
            if plan is None or (nxt.parent is not item.parent and not self.one_loader):
                return
            if nxt.nodeid in self._futures or nxt.get_closest_marker("skip") or nxt.get_closest_marker("skipif"):
                continue  # a check that will not run (or plans itself when it does) runs nothing ahead
            env = self._env_for(nxt)
            if env is None:
                continue
            try:
                call = plan(env, **_params(nxt, plan))
            except pytest.skip.Exception:
                continue  # it skips itself, with its reason, when pytest reaches it
            self._futures[nxt.nodeid] = self._submit(call)
