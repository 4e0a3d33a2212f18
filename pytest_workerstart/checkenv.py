"""What every conformance check gets as its ``check_env`` fixture.

Checks stay short: they describe the scenario and the expectation; building
the loader through the protocol, instrumenting the context, holding and then
releasing a raised exception, and judging leak snapshots all live here.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import psutil
import pytest

from pytest_workerstart import protocol, registry, space
from pytest_workerstart._torch_internals import MP_STATUS_CHECK_INTERVAL as join_s
from pytest_workerstart._torch_internals import forget_killed_workers
from pytest_workerstart.bounded import BoundedLoader
from pytest_workerstart.harness import cleanup, lookahead
from pytest_workerstart.harness.forkserver import warm_forkserver
from pytest_workerstart.harness.reaper import Terminated, kill_and_wait, sigchld_ignored
from pytest_workerstart.probes import leaks, shm
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.deadline import (
    StepAborted,
    deadline,
    memory_limit_bytes,
    thread_stacks,
    tree_memory_over,
)
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.probes.leaks import LeakReport, LeakSnapshot
from pytest_workerstart.verdict import MEASUREMENTS, record_measurements

T = TypeVar("T")
#: (loader spec, context, what, key...) -> (nodeid that made the run, "ok" | "failed", facts or error line)
OBSERVATIONS = pytest.StashKey[dict]()


#: the step that releases a held error (the loader's shutdown after it failed)
RELEASE_STEP = "the shutdown after the error was released"


class HeldException:
    """An exception kept referenced (as ``pytest.raises`` would) until released."""

    def __init__(self, exc: BaseException | None):
        self._box = [exc]

    @property
    def exc(self) -> BaseException | None:
        return self._box[0]

    def release(self) -> None:
        """Drop the error as a reference cycle is dropped: what only the error holds (often the
        loader's iterator, through the traceback's frames) is freed by the cyclic collector, which
        runs the weakref finalizers of that garbage (multiprocessing queues' among them) before
        any ``__del__``, never by reference counting. Whether a traceback forms such a cycle
        depends on the frames it kept, and a loader's shutdown may differ between the two ways
        (torch's waits its join timeout for each worker under the collector): the harder one,
        every time."""
        box = self._box
        box.append(box)
        self._box = []
        del box
        gc.collect()


@dataclasses.dataclass
class CheckEnv:
    context_name: str
    loader: Any  # protocol.LoaderUnderTest
    settings: Any  # settings.Settings
    request: pytest.FixtureRequest
    #: num_workers -> seconds a step that waits on the loader may take (None: unbounded)
    step_timeout: Callable[[int], float | None] = lambda n: None
    #: seconds one spawn worker's boot takes in this run (measured once per session)
    boot_cost: Callable[[], float] = lambda: 0.0
    _contexts: list = dataclasses.field(default_factory=list)
    _shm_before: dict = dataclasses.field(default_factory=lambda: shm.shm_entries())
    #: (step, identity, description) of the last error the loader raised inside a bounded
    #: step; never the exception itself, whose traceback would keep the loader alive
    last_step_error: tuple[str, tuple[int, type], str] | None = None
    #: the session's :class:`~pytest_workerstart.harness.lookahead.ScenarioLookahead` (None: one at a time)
    lookahead: Any = None
    #: an iterator's shutdown that blew its deadline where nothing could raise (a release in ``__del__``)
    shutdown_failure: StepAborted | None = None
    #: /dev/shm entries the suite unlinked after a step was stopped (:meth:`stop_tree`)
    cleaned_shm: list = dataclasses.field(default_factory=list)
    #: what the check's processes (this one and its session's descendants) create in /dev/shm
    _watch: shm.ShmWatch | None = None

    def watch_shm(self) -> None:
        """Attribute what the check's processes create in /dev/shm, for :meth:`close` to remove:
        sampled on the clock and whenever an entry other than torch's per-batch ones appears; not
        the scenarios' sessions (their runner watches and cleans them), nor another job's."""
        session = os.getsid(0)
        self._watch = shm.ShmWatch(interval=1.0, member=lambda pid: _session_of(pid) == session, quiet=QUIET_SHM)
        self._watch.__enter__()
        self._shm_before = self._watch.before

    # --- bounded steps -------------------------------------------------------
    def step(self, name: str, fn: Callable[[], Any], num_workers: int, ctx: InstrumentedContext | None,
             timeout: float | None = None):
        """Run one step that waits on the loader under its deadline (``timeout``, else the step
        deadline for ``num_workers``).

        On expiry the check fails with the driver's and the workers' stacks,
        naming the step, and the workers this context started are killed.
        An error the loader raises is remembered for the circuit breaker.
        """
        def stacks() -> str:
            workers = ctx.dump_worker_stacks() if ctx is not None else ""
            return "\n".join(p for p in (thread_stacks(), workers) if p)

        self.raise_shutdown_failure()  # the check ends at its first hung shutdown, not one bound per iterator

        try:
            bound = self.step_timeout(num_workers) if timeout is None else timeout
            with deadline(name, bound, on_expiry=stacks, guard=self.memory_guard()):
                return fn()
        except StepAborted as exc:
            self.last_step_error = (name, _identity(exc), exc.kind)
            cleaned = self.stop_tree(ctx)
            if cleaned:
                exc.add_cleanup(cleaned)
            raise
        except StopIteration:
            raise
        except KeyboardInterrupt:  # Ctrl-C, or pytest's SIGTERM: the run ends, nothing of the loader stays
            self.stop_tree(ctx)
            raise
        except BaseException as exc:
            first = str(exc).splitlines()[0][:120] if str(exc) else ""
            self.last_step_error = (name, _identity(exc), f"{type(exc).__name__}: {first}")
            raise

    def stop_tree(self, ctx: InstrumentedContext | None) -> str:
        """The cleanup of a step stopped early, the same as a normal ending's: the workers ``ctx``
        started (and their children) killed and reaped, and the ``/dev/shm`` entries they mapped
        or held open that this check's run created unlinked (only those: attribution, never
        another process's). Named semaphores stay with the resource tracker, which registered
        them and unlinks them once their holders are gone. Returns what was done, in words."""
        if ctx is None:
            return ""

        victims = ctx.worker_tree()
        if not victims:
            return ""
        mapped = shm.shm_entries_mapped_by([v.pid for v in victims])
        with sigchld_ignored():  # a loader's SIGCHLD handler (torch's) would raise for the workers killed here
            kill_and_wait(victims)
            if "torch.utils.data" in sys.modules:  # ... and at every later SIGCHLD, while their iterator lives
                forget_killed_workers({v.pid for v in victims})
        gone = cleanup.unlink_created_since(self._shm_before, {n: i for n, i in mapped.items()
                                                             if not n.startswith("sem.")})
        self.cleaned_shm.extend(gone)
        done = f"killed {len(victims)} worker process{'es' if len(victims) != 1 else ''}"
        return f"{done}, {unlinked(gone)}" if gone else done

    def release(self, box: list, step: str, num_workers: int, ctx: InstrumentedContext | None) -> None:
        """Empty ``box``, which holds the last reference to the loader's iterator (its shutdown
        runs then), as a bounded step.

        Where a release cannot raise (``__del__``), a blown deadline is kept and
        fails the check once its function returns (:meth:`raise_shutdown_failure`).
        """
        pending, self.shutdown_failure = self.shutdown_failure, None  # this release is bounded all the same
        try:
            self.step(step, box.clear, num_workers, ctx)
        except StepAborted as exc:
            pending = pending or exc.with_traceback(None)  # its frames would keep the loader's iterator alive
        finally:
            self.shutdown_failure = pending

    def release_held(self, held: HeldException, num_workers: int, ctx: InstrumentedContext | None = None) -> None:
        """Release a held error as a bounded step: the loader's shutdown that follows (often
        from the cyclic garbage collector: a traceback holds the iterator) gets the failure
        patience, as every wait after a failure does. Not counted by the circuit breaker:
        the patience, not a step deadline, bounds it.

        Released once every worker the loader started has booted (or ended), up to the step
        deadline: whether a shutdown finds workers still booting is a race in the loader's start
        the suite does not judge here; it fixes that state so the verdict does not depend on it."""
        booting = [] if ctx is None else ctx.wait_booted(self.step_timeout(num_workers) or self.leak_patience)
        if self.request is not None:  # the wall-time bound; a stall within it is judged by its mechanism
            record_measurements(self.request.node, release_bound_s=round(self.leak_patience, 1),
                                **({"released_while_booting": booting} if booting else {}))
        began = time.monotonic()
        try:
            self.step(RELEASE_STEP, held.release, num_workers, ctx, timeout=self.leak_patience)
        finally:
            self.last_step_error = None
        if ctx is not None:
            _judge_release(ctx, time.monotonic() - began)

    def raise_shutdown_failure(self) -> None:
        """Fail the check if an iterator's shutdown hung: a loader that does not shut down has not passed."""
        if self.shutdown_failure is not None:
            exc, self.shutdown_failure = self.shutdown_failure, None
            self.last_step_error = (exc.step, _identity(exc), exc.kind)  # what the circuit breaker compares
            raise exc

    @property
    def memory_limit(self) -> int:
        """Bytes of memory (PSS) the loader's tree may reach (in-process steps and scenarios)."""
        return memory_limit_bytes(self.settings.memory_limit)

    @property
    def scenario_memory_limit(self) -> int:
        """The bound of one scenario's tree: the setting, else the default shared by the scenarios run at once."""
        jobs = self.lookahead.jobs if self.lookahead is not None else 1
        if self.settings.memory_limit is not None or jobs <= 1:
            return self.memory_limit
        return self.memory_limit // jobs

    def scenario_result(self) -> Any:
        """The result of this check's ``@planned_scenario`` (see :mod:`pytest_workerstart.harness.lookahead`)."""
        res = (lookahead.run_now(self.request.node, self) if self.lookahead is None
               else self.lookahead.result(self.request.node, self))
        space.note(getattr(res, "built", ()))  # a result type that records no builds lists none
        self.cleaned_shm.extend(getattr(res, "shm_named", ()))  # reported at teardown with the rest
        return res

    def memory_guard(self) -> Callable[[], str | None]:
        return tree_memory_over(self.memory_limit)

    def failure_signature(self, exc: BaseException) -> str | None:
        """How this check failed, if the loader itself failed inside a step ("hang at next() #1")."""
        if self.last_step_error is None:
            return None
        step, ident, what = self.last_step_error
        if ident != _identity(exc):  # the check failed for another reason
            return None
        if what in ("hang", "memory"):
            return f"{what} at {step}"
        return f"{what.split(':', 1)[0]} at {step}: {what.split(': ', 1)[-1]}"

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
        """Build the loader under test (``parallelism=None``: don't pass the kwarg).

        Returns it wrapped so that ``iter()``, every batch and the iterator's shutdown
        are bounded steps (``num_workers=0``: no multiprocessing context is passed)."""
        if ctx is None and num_workers:
            ctx = self.context(num_workers)
        if "batch_sampler" not in kwargs:  # torch refuses a batch_size beside a batch_sampler
            kwargs.setdefault("batch_size", 2)
        if num_workers:
            kwargs["multiprocessing_context"] = ctx
        built = self.step("building the loader", lambda: self.loader.make(
            dataset, num_workers=num_workers, parallelism=parallelism, **kwargs), num_workers, ctx)
        return BoundedLoader(built, self, num_workers, ctx)

    def observe(self, what: str, fn: Callable[[], T], *key: Hashable) -> T:
        """``fn()``, run once per loader, context, ``what`` and ``key`` in this session.

        Several check ids judge one run of the loader instead of each booting the same
        workers. ``fn`` returns the run's facts, never the loader or its batches (they would
        keep workers, fds or shared memory alive past the check that made the run). A check
        run alone with ``-k`` makes the run itself; one that reuses it records where it was
        made, and a run that failed fails every check that judges it without running again."""
        cache = self.request.config.stash.setdefault(OBSERVATIONS, {})
        full = (self.loader.spec, self.context_name, what, *key)
        if full in cache:
            origin, status, value, built = cache[full]
            record_measurements(self.request.node, observed_in=origin)
            space.note(built)
            if status == "failed":
                pytest.fail(f"{what}: the run this check judges failed in {origin}: {value}", pytrace=False)
            return value
        with space.recording() as built:
            try:
                value = fn()
            except (Exception, pytest.fail.Exception) as exc:  # a skip is not a failed run: not cached
                line = (str(exc).strip().splitlines() or [""])[0][:300]
                cache[full] = (self.request.node.nodeid, "failed", f"{type(exc).__name__}: {line}", built)
                raise
        cache[full] = (self.request.node.nodeid, "ok", value, built)
        return value

    @property
    def parallel_start_here(self) -> bool:
        return self.loader.has("parallel_start", self.context_name)

    def parallelism(self, p: int) -> int | None:
        """``p`` where the loader declares parallel start in this context, else None (its keyword omitted)."""
        return p if self.parallel_start_here else None

    def snapshot(self) -> LeakSnapshot:
        if self.context_name == "forkserver":
            warm_forkserver()
        return LeakSnapshot.take()

    # --- judging -------------------------------------------------------------
    def run_expecting_failure(self, fn: Callable[[], Any], what: str = "the loader did not raise") -> HeldException:
        """Run ``fn``, which must raise; the error is held (``what``: the failure if it does not)."""
        try:
            fn()
        except BaseException as exc:
            if isinstance(exc, (pytest.fail.Exception, pytest.skip.Exception, Terminated)):
                raise
            return HeldException(exc)
        pytest.fail(what)

    @property
    def leak_patience(self) -> float:
        """How long teardown after a failure may take (:func:`.probes.leaks.patience`); ordinary
        endings get ``--workerstart-exit-timeout``."""
        return leaks.patience(self.boot_cost())

    def assert_clean(self, before: LeakSnapshot, what: str, timeout: float | None = None) -> None:
        report = LeakSnapshot.wait_clean(before, timeout=self.leak_patience if timeout is None else timeout)
        if report:
            pytest.fail(f"{what}: leaked {report.summary()}\n{report.format()}", pytrace=False)

    def assert_clean_around(self, before: LeakSnapshot, held: HeldException, what: str, num_workers: int = 0,
                            ctx: InstrumentedContext | None = None) -> LeakReport:
        """The failure-path leak contract.

        While the exception is held: no live or zombie child, no extra thread.
        Once released and collected: no extra fd, semaphore or shm segment.
        fds/semaphores/shm that vanish on release are "held by the exception":
        reported, and a failure only with ``--workerstart-strict``.
        """
        strict = self.settings.strict
        live = LeakSnapshot.wait_clean(before, kinds=("processes", "threads", "dangling"), timeout=self.leak_patience)
        if live:
            pytest.fail(f"{what}: while the exception is held: {live.summary()}\n{live.format()}", pytrace=False)
        while_held = before.diff(LeakSnapshot.take())
        self.release_held(held, num_workers, ctx)
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
        # What the suite's workers still mapped as they exited and nobody removed: the
        # loader's leak (leaks.shm_segments judges it), never left on the machine.
        # Named semaphores stay: the resource tracker owns their names and unlinks them.
        # Workers still alive now outlived every judgement (an interrupted or stopped step whose
        # error was swallowed on the way, a loader that never stops them): stopped like a step.
        stopped = [done for done in (self.stop_tree(ctx) for ctx in self._contexts) if done]
        # ... and what else this check's processes created and left there, whatever the check
        # judged (a driver's segment never unlinked, a torch segment whose worker died first)
        left: dict[str, int] = {}
        if self._watch is not None:
            self._watch.pids.update(r.pid for ctx in self._contexts for r in ctx.records() if r.pid)
            self._watch.__exit__(None, None, None)
            left = self._watch.created()
        for ctx in self._contexts:
            left.update(ctx.shm_at_exit())
        left = {n: i for n, i in left.items() if not n.startswith("sem.")}
        gone = cleanup.unlink_created_since(self._shm_before, left) if left else []
        forked_by = set().union(*(ctx.forked_by() for ctx in self._contexts))
        if forked_by and self.request is not None:
            record_measurements(self.request.node, workers_forked_by=sorted(forked_by))
        if stopped and self.request is not None:
            self.request.node.add_report_section("teardown", "workerstart",
                                                 "at teardown the suite " + "; ".join(stopped))
        if gone and self.request is not None:
            self.request.node.add_report_section(
                "teardown", "workerstart", f"unlinked {len(gone)} /dev/shm entries the loader's processes left: "
                + ", ".join(gone))
        if (self.cleaned_shm or gone) and self.request is not None:
            record_measurements(self.request.node, shm_unlinked_by_suite=sorted(set(self.cleaned_shm) | set(gone)))
        for ctx in self._contexts:
            ctx.close()


def _judge_release(ctx: InstrumentedContext, took: float) -> None:
    """A shutdown that outlasted a join's timeout (torch's: each worker's join waits this long,
    then the worker is terminated) and left ready workers ended by a signal, not by their own
    loop's end, waited that timeout out: a stall, whatever the wall-time bound (which grows with
    the boot cost) allowed. Judged from what the workers did, not from how long it took."""
    if took < join_s:
        return
    killed = [r.worker for r in ctx.records() if r.ready is not None and r.exited is None and not _alive(r.pid)]
    if killed:
        pytest.fail(f"the shutdown after the error was released took {took:.1f} s and ended worker"
                    f"{'s' if len(killed) > 1 else ''} {', '.join(map(str, killed))} by a signal, not by the end of "
                    f"its work: it waited out a join's {join_s:g} s timeout (torch's) instead of ending them",
                    pytrace=False)


def _alive(pid: int | None) -> bool:
    try:
        return pid is not None and leaks.alive(psutil.Process(pid))
    except psutil.Error:
        return False


#: /dev/shm names whose appearance wakes no sample of a check's tree: torch's per-batch segments
#: (named for their creator) and named semaphores (the resource tracker's to unlink)
QUIET_SHM = re.compile(rf"{shm.TORCH_FD_NAME.pattern}|^sem\.")


def _identity(exc: BaseException) -> tuple[int, type]:
    """An exception's identity without a reference to it: its id alone is reused by the next
    object allocated where it was (the check's own failure, raised after the loader's error was
    recorded and dropped), its type with it rarely."""
    return id(exc), type(exc)


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def unlinked(names: list[str]) -> str:
    """What the suite removed from ``/dev/shm``, for a verdict's reason."""
    return f"unlinked {len(names)} /dev/shm entr{'y' if len(names) == 1 else 'ies'} the loader's processes left: " + \
        ", ".join(names)


@pytest.fixture
def check_env(request, ws_context, ws_loader, ws_settings, ws_step_timeout, ws_boot_cost, ws_lookahead):
    """The environment of one check; skips it (with the reason) if the loader lacks what it needs."""
    marker = request.node.get_closest_marker("workerstart_check")
    gap = protocol.requirement_gap(ws_loader, registry.get(marker.args[0]), ws_context) if marker else None
    if gap:
        pytest.skip(gap)
    env = CheckEnv(ws_context, ws_loader, ws_settings, request, ws_step_timeout, ws_boot_cost, lookahead=ws_lookahead)
    env.watch_shm()
    with space.recording() as built:
        yield env
    record_fixed_points(request.node, built)
    env.close()
    env.raise_shutdown_failure()  # an iterator the check's fixtures held, released only now


def record_fixed_points(node: pytest.Item, built: list[str]) -> None:
    """The case's judged points, where it did not record its own (a case of a declared space
    records the corner or explored points it judged, with their outcomes)."""
    if any(key == MEASUREMENTS and "points" in value for key, value in node.user_properties):
        return
    record_measurements(node, points=[{"point": t, "origin": "fixed"} for t in dict.fromkeys(built)])
