"""What ``--workerstart`` adds to a pytest session.

:class:`WorkerstartSession` holds one run's state and lifecycle: the loader (a bad SPEC exits 4
with one line), the preflight, the lookahead's drains, the circuit breaker, the guard that cleans
up if pytest is killed. Its parts are plugins of their own: :mod:`.collection`,
:mod:`.check_fixtures` and :mod:`.reporter` (the verdict file, the terminal summary);
:mod:`.waits` says how long a step may take.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from pytest_workerstart import baseline, protocol, registry
from pytest_workerstart.checkenv import CheckEnv
from pytest_workerstart.cores import usable_cores
from pytest_workerstart.harness import cleanup, reaper, zygote
from pytest_workerstart.harness.lookahead import ScenarioLookahead
from pytest_workerstart.probes.deadline import memory_limit_bytes
from pytest_workerstart.session import preflight, reruns
from pytest_workerstart.session.breaker import CircuitBreaker
from pytest_workerstart.session.check_fixtures import CheckFixtures
from pytest_workerstart.session.collection import CheckCollection, add_suite_path
from pytest_workerstart.session.reporter import VerdictReporter
from pytest_workerstart.session.waits import Waits
from pytest_workerstart.settings import Settings, in_xdist_worker, runs_checks
from pytest_workerstart.verdict import Verdict


class WorkerstartSession:
    """The state of one ``--workerstart`` run, registered as a plugin with its parts."""

    def __init__(self, config: pytest.Config, loader: protocol.LoaderUnderTest, settings: Settings,
                 contexts: tuple[str, ...], embedded: bool = False):
        self.config = config
        #: embedded: the checks were imported into a project's own tests (plugin.pytest_pycollect_makeitem)
        self.embedded = embedded
        self.loader = loader
        self.settings = settings
        self.contexts = contexts

        self.baseline = baseline.load(settings.baseline) if settings.baseline else None
        self.waits = Waits(settings)
        self.lookahead = ScenarioLookahead(self._scenario_jobs(), self._env_for, one_loader=not embedded)
        self.verdict = Verdict(loader.describe(), self._settings_record(), self.baseline)
        self.breaker = CircuitBreaker(settings.circuit_breaker)
        self._preflown: set[str] = set()
        #: the lines said when the preflight rejected the loader (then nothing else is)
        self.preflight_failure: list[str] = []
        self.collection = CheckCollection(settings, contexts, self.verdict, lambda: self.loader.parallel_contexts())
        self.reporter = VerdictReporter(self)
        self.fixtures = CheckFixtures(self)
        cleanup.share_temp_dir()  # before any check starts a worker: none leaves a folder of its own

    @classmethod
    def from_config(cls, config: pytest.Config, settings: Settings, embedded: bool = False) -> WorkerstartSession:
        try:
            overrides: dict[str, Any] = {}
            for item in settings.capability:
                name, value = protocol.parse_capability(item)
                overrides[name] = value
            contexts = settings.context or protocol.available_contexts()
            loader = protocol.resolve(settings.loader, settings.parallelism_kwarg, overrides)
        except protocol.SpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        # The verdict is the output: tracebacks only when asked for (-v or --tb=...).
        if not embedded and config.option.tbstyle == "auto" and config.option.verbose <= 0:
            config.option.tbstyle = "no"
        # torch warns when num_workers exceeds the cores; the suite does that on purpose.
        config.addinivalue_line("filterwarnings", "ignore:This DataLoader will create:UserWarning")
        self = cls(config, loader, settings, contexts, embedded)
        if not embedded:
            add_suite_path(config)
        return self

    def register(self, pluginmanager: pytest.PytestPluginManager) -> None:
        pluginmanager.register(self, "workerstart-session")
        pluginmanager.register(self.collection, "workerstart-collection")
        pluginmanager.register(self.fixtures, "workerstart-fixtures")
        pluginmanager.register(self.reporter, "workerstart-reporter")

    def _scenario_jobs(self) -> int:
        if self.settings.scenario_jobs is not None:
            return self.settings.scenario_jobs
        if in_xdist_worker():
            return 1
        return max(1, min(2, usable_cores()))

    def _env_for(self, item: pytest.Item):
        """The CheckEnv ``item`` will get (for planning it ahead), or None if it will be skipped."""
        marker = item.get_closest_marker("workerstart_check")
        context = item.callspec.params.get("ws_context") if hasattr(item, "callspec") else None
        if marker is None or context is None:
            return None
        if protocol.requirement_gap(self.loader, registry.get(marker.args[0]), context):
            return None
        return CheckEnv(context, self.loader, self.settings, None, self.waits.step_timeout,
                        self.waits.measured_boot_cost, lookahead=self.lookahead)

    def _settings_record(self) -> dict[str, Any]:
        record = self.settings.for_verdict()
        record["scenario_jobs"] = self.lookahead.jobs
        record["parallelism_kwarg"] = self.loader.parallelism_kwarg
        record["contexts_requested"] = list(self.contexts)
        record["parallel_start"] = list(self.loader.parallel_contexts())
        return record

    def adopt(self, loader: protocol.LoaderUnderTest) -> None:
        """Judge ``loader`` (from a fixture) instead of the settings' SPEC."""
        self.loader = loader
        self.breaker.clear()  # a run of failures is one loader's
        self.verdict.loader = loader.describe()
        self.verdict.settings = self._settings_record()
        if self.settings.preflight and loader.spec not in self._preflown:
            self._preflight(loader)

    def _preflight(self, loader: protocol.LoaderUnderTest) -> None:
        """Stop the run with one line if the loader cannot deliver a batch (see :mod:`.preflight`)."""
        self._preflown.add(loader.spec)
        context, timeout = self.contexts[0], self.waits.preflight_timeout()
        res = preflight.run(loader, context, timeout=timeout,
                            memory_limit=memory_limit_bytes(self.settings.memory_limit))
        lines = preflight.failure_lines(loader, context, res, timeout)
        if not lines:
            self.waits.boot_cost = res.value["boot_s"]
            return
        self.verdict.not_run_reason = preflight.not_run_reason(lines)
        self.preflight_failure = lines
        self.reporter.write(final=False)
        pytest.exit("workerstart: preflight failed, no check ran", returncode=pytest.ExitCode.USAGE_ERROR)

    # --- hooks -------------------------------------------------------------------
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collection.select(session)
        if self.settings.preflight and self.verdict.records and runs_checks(self.config) \
                and not self.embedded:
            self._preflight(self.loader)
        # Checks collect garbage after each loader (iterators in reference cycles end there), and
        # pytest at exit; with torch imported a full collection walks ~200k objects, 0.1 s of CPU
        # each time. What exists now (modules, collected items) lives through the run: not walked.
        gc.freeze()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Start the guard that cleans up if pytest itself is killed, and let a SIGTERM end the
        run as Ctrl-C does (the running step's cleanup, then the fixtures' teardown)."""
        reaper.start_guard(verdict=self.reporter.json_path)

        def stop() -> None:
            session.shouldstop = "pytest was sent SIGTERM"

        self._sigterm = reaper.terminate_as_interrupt(stop)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        try:
            return (yield)
        finally:
            # no scenario run ahead outlives the run of checks it was planned for
            if not self.lookahead.may_run_beside(item, nextitem):
                self.lookahead.drain()

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function):
        try:
            result = yield
        except reruns.JUDGEMENT as exc:
            if not reruns.judged_again(pyfuncitem, exc) or self.settings.failure_runs < 2:
                raise
            reruns.judge_again(pyfuncitem, exc, self.settings.failure_runs)
        env = pyfuncitem.funcargs.get("check_env")
        if env is not None:
            env.raise_shutdown_failure()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if call.when != "call" or item.get_closest_marker("workerstart_check") is None:
            return report
        if report.passed:
            self.breaker.clear()
        elif report.failed and not hasattr(report, "wasxfail"):
            env = getattr(item, "funcargs", {}).get("check_env")
            sig = env.failure_signature(call.excinfo.value) if env is not None and call.excinfo else None
            reason = self.breaker.observe(item.nodeid, sig)
            if reason is not None:
                self.verdict.not_run_reason = reason
                item.session.shouldstop = reason
        return report

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        self.lookahead.close()
        zygote.shutdown()
        reaper.reap_session()
        if self.settings.repro is not None:
            self.reporter.write_reproducers(self.settings.repro)
        self.reporter.write(final=True, exitstatus=int(exitstatus))

    @pytest.hookimpl(trylast=True)  # after pytest's own collection at exit
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        gc.unfreeze()  # a process that goes on (an inline run) collects as before
        reaper.restore_sigterm(getattr(self, "_sigterm", None))
        reaper.stop_guard()
