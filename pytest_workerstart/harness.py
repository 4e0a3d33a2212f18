"""What every conformance check gets as its ``ws`` fixture.

Checks stay short: they describe the scenario and the expectation; building
the loader through the protocol, instrumenting the context, holding and then
releasing a raised exception, and judging leak snapshots all live here.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import threading
from typing import Any, Callable

import pytest

from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.probes.leaks import LeakReport, LeakSnapshot

#: Modules the forkserver imports once, so forked workers boot in milliseconds.
#: Explicit names: the implicit ``__main__`` preload differs across Python
#: versions (cpython#126631) and the suite must not depend on it.
FORKSERVER_PRELOAD = ["torch", "torch.utils.data", "pytest_workerstart.fixtures.datasets",
                      "pytest_workerstart.reference", "pytest_workerstart.probes.context"]

_preloaded = False

#: How long teardown may take before what is left counts as leaked. Stock torch
#: needs ~16 s after a held worker error (a 5 s join per worker, then terminate).
LEAK_PATIENCE_S = 20.0


def warm_forkserver() -> None:
    """Set the preload list before the forkserver first starts, then start it
    (and the resource tracker) so their one-time fds precede any snapshot."""
    global _preloaded
    if _preloaded:
        return
    from multiprocessing import forkserver, resource_tracker

    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    forkserver.ensure_running()
    resource_tracker.ensure_running()
    _preloaded = True


class HeldException:
    """An exception kept referenced (as ``pytest.raises`` would) until released."""

    def __init__(self, exc: BaseException | None):
        self._box = [exc]

    @property
    def exc(self) -> BaseException | None:
        return self._box[0]

    def release(self) -> None:
        self._box.clear()
        gc.collect()


def exception_chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


@dataclasses.dataclass
class CheckEnv:
    context_name: str
    loader: Any  # protocol.LoaderUnderTest
    settings: Any  # session.Settings
    request: pytest.FixtureRequest
    _contexts: list = dataclasses.field(default_factory=list)

    # --- building ----------------------------------------------------------
    def context(self, num_workers: int, faults: FaultPlan | None = None, hold: float | None = None,
                method: str | None = None) -> InstrumentedContext:
        method = method or self.context_name
        if method == "forkserver":
            warm_forkserver()
        ctx = InstrumentedContext(method, num_workers=num_workers, faults=faults, hold_for_overlap=hold)
        self._contexts.append(ctx)
        return ctx

    def make(self, dataset, *, num_workers: int, ctx=None, parallelism: int | None = None, **kwargs):
        """Build the loader under test (``parallelism=None``: don't pass the kwarg)."""
        if ctx is None:
            ctx = self.context(num_workers)
        kwargs.setdefault("batch_size", 2)
        return self.loader.make(dataset, num_workers=num_workers, multiprocessing_context=ctx,
                                parallelism=parallelism, **kwargs)

    @property
    def max_parallel(self) -> bool:
        return self.loader.has("parallel_start", self.context_name)

    def snapshot(self) -> LeakSnapshot:
        if self.context_name == "forkserver":
            warm_forkserver()
        return LeakSnapshot.take()

    # --- judging -------------------------------------------------------------
    def run_expecting_failure(self, fn: Callable[[], Any]) -> HeldException:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is a legitimate outcome here
            if isinstance(exc, (pytest.fail.Exception, pytest.skip.Exception)):
                raise
            return HeldException(exc)
        pytest.fail("the loader did not raise")

    def assert_clean(self, before: LeakSnapshot, what: str, timeout: float = LEAK_PATIENCE_S) -> None:
        report = LeakSnapshot.wait_clean(before, timeout=timeout)
        if report:
            pytest.fail(f"{what}: leaked {report.summary()}\n{report.format()}", pytrace=False)

    def assert_clean_around(self, before: LeakSnapshot, held: HeldException, what: str) -> LeakReport:
        """The failure-path leak contract.

        While the exception is held: no live or zombie child, no extra thread.
        Once released and collected: no extra fd, semaphore or shm segment.
        fds/semaphores/shm that vanish on release are "held by the exception":
        reported, and a failure only with ``--workerstart-strict``.
        """
        strict = self.settings.strict
        live = LeakSnapshot.wait_clean(before, kinds=("processes", "threads", "dangling"), timeout=LEAK_PATIENCE_S)
        if live:
            pytest.fail(f"{what}: while the exception is held: {live.summary()}\n{live.format()}", pytrace=False)
        while_held = before.diff(LeakSnapshot.take())
        held.release()
        self.assert_clean(before, f"{what}: after the exception was released")
        held_only = while_held.only(("fds", "shm"))
        if held_only:
            msg = f"{what}: held only by the referenced exception: {held_only.summary()}"
            self.request.node.user_properties.append(("workerstart_held_by_exception", held_only.counts()))
            if strict:
                pytest.fail(f"{msg} (strict mode)\n{held_only.format()}", pytrace=False)
            self.request.node.add_report_section("call", "workerstart", msg)
        return held_only

    def close(self) -> None:
        for ctx in self._contexts:
            ctx.close()


def batches_of(loader, limit: int | None = None) -> list:
    out = []
    for i, batch in enumerate(loader):
        out.append(batch)
        if limit is not None and i + 1 >= limit:
            break
    return out


def threads_named(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.fixture
def ws(request, ws_context, ws_loader, ws_settings):
    env = CheckEnv(ws_context, ws_loader, ws_settings, request)
    yield env
    env.close()
