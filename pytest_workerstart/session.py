"""What ``--workerstart`` adds to a pytest session.

Resolves the loader (usage errors exit 4 with one line), adds the suite to the
collected paths, parametrizes every ``workerstart_check`` over the selected
contexts (from the registry), applies the expected-failure file, runs the
preflight, bounds each step (via ``check_env``), trips the circuit breaker, and
reports: header, per-check table, coverage, the JSON verdict. What a check
requires of the loader is judged when it starts (``checkenv.check_env``).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import protocol, registry, report
from pytest_workerstart.settings import Settings
from pytest_workerstart.verdict import MEASUREMENTS, Verdict, parse_nodeid

SUITE_DIR = Path(__file__).resolve().parent / "conformance"
if not SUITE_DIR.is_dir():  # running from a source checkout (editable install)
    SUITE_DIR = Path(__file__).resolve().parent.parent / "conformance"

#: Per-check hard limit (pytest-timeout) unless the check sets its own: the
#: last resort behind the per-step deadlines (see ``step_timeout``).
CHECK_TIMEOUT_S = 300
#: Step deadline = max(STEP_FLOOR_S, STEP_BASE_S + STEP_BOOTS x boot cost x num_workers):
#: a serial start pays one boot per worker; 3x leaves room for a loaded machine.
STEP_FLOOR_S, STEP_BASE_S, STEP_BOOTS = 20.0, 10.0, 3.0
#: Hard limit of the preflight scenario unless --workerstart-step-timeout is given.
PREFLIGHT_TIMEOUT_S = 60.0
ADAPTER_DOCS = "docs/adapter.md"
#: GitHub Actions names the job summary file here; the final verdict's table is appended to it
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


class WorkerstartSession:
    """The state of one ``--workerstart`` run, registered as a plugin."""

    def __init__(self, config: pytest.Config, loader: protocol.LoaderUnderTest, settings: Settings,
                 contexts: tuple[str, ...], embedded: bool = False):
        self.config = config
        #: embedded: the checks were imported into a project's own tests (plugin.pytest_pycollect_makeitem)
        self.embedded = embedded
        self._preflown: set[str] = set()
        self._from_fixture: tuple | None = None  # (what workerstart_loader returned, its LoaderUnderTest)
        self.loader = loader
        self.settings = settings
        self.contexts = contexts
        from pytest_workerstart import baseline

        self.baseline = baseline.load(settings.baseline) if settings.baseline else None
        from pytest_workerstart.harness.lookahead import ScenarioLookahead

        self.lookahead = ScenarioLookahead(self._scenario_jobs(), self._env_for, one_loader=not embedded)
        self.verdict = Verdict(loader.describe(), self._settings_record(), self.baseline)
        self._matched_xfails: set[tuple[str, str | None]] = set()
        self._started = time.monotonic()
        self.boot_cost: float | None = None  # seconds; measured by the preflight (or lazily)
        self._streak: list[tuple[str, str]] = []  # (nodeid, failure signature) of the current run of failures
        #: the lines said when the preflight rejected the loader (then nothing else is)
        self.preflight_failure: list[str] = []
        # Under xdist only the controller writes the verdict (and reproducers).
        self._json_writer = not hasattr(config, "workerinput")
        self._json = settings.json_path if self._json_writer else None

    # --- configuration -----------------------------------------------------
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
            self._add_suite_path()
        return self

    def coverage(self) -> dict[str, dict[str, str]]:
        """Per context that ran, per clause: "parallel" if a check of it ran (passed or
        failed) where the loader declares parallel start, else "serial"."""
        declared = set(self.loader.parallel_contexts())
        out: dict[str, dict[str, str]] = {}
        for r in self.verdict.records.values():
            if r.state != "finished" or r.outcome in ("skipped", None) or r.context is None:
                continue
            check = registry.CHECKS.get(r.id)
            path = "parallel" if check and check.parallel_path and r.context in declared else "serial"
            clauses = out.setdefault(r.context, {})
            if clauses.get(check.clause if check else r.id) != "parallel":
                clauses[check.clause if check else r.id] = path
        return {ctx: dict(sorted(c.items())) for ctx, c in sorted(out.items())}

    def forked_by(self) -> dict[str, dict[str, int]]:
        """Per context, which process forked the workers of how many in-process checks (the
        instrumented context's observation: a loader's own forkserver shows as "another process")."""
        out: dict[str, dict[str, int]] = {}
        for r in self.verdict.records.values():
            for who in (r.measurements or {}).get("workers_forked_by", ()):
                per = out.setdefault(r.context or "-", {})
                per[who] = per.get(who, 0) + 1
        return dict(sorted(out.items()))

    def _scenario_jobs(self) -> int:
        if self.settings.scenario_jobs is not None:
            return self.settings.scenario_jobs
        if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist already runs checks side by side
            return 1
        from pytest_workerstart.cores import usable_cores

        return max(1, min(2, usable_cores()))

    def _env_for(self, item: pytest.Item):
        """The CheckEnv ``item`` will get (for planning it ahead), or None if it will be skipped."""
        from pytest_workerstart.checkenv import CheckEnv

        marker = item.get_closest_marker("workerstart_check")
        context = item.callspec.params.get("ws_context") if hasattr(item, "callspec") else None
        if marker is None or context is None:
            return None
        if protocol.requirement_gap(self.loader, registry.get(marker.args[0]), context):
            return None
        return CheckEnv(context, self.loader, self.settings, None, self.step_timeout, self.measured_boot_cost,
                        lookahead=self.lookahead)

    def _settings_record(self) -> dict[str, Any]:
        record = self.settings.for_verdict()
        record["scenario_jobs"] = self.lookahead.jobs
        record["parallelism_kwarg"] = self.loader.parallelism_kwarg
        record["contexts_requested"] = list(self.contexts)
        record["parallel_start"] = list(self.loader.parallel_contexts())
        return record

    def _add_suite_path(self) -> None:
        cfg = self.config
        if cfg.args_source == pytest.Config.ArgsSource.ARGS:
            cfg.args = [*cfg.args, str(SUITE_DIR)]
        else:
            cfg.args = [str(SUITE_DIR)]

    # --- collection --------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        marker = metafunc.definition.get_closest_marker("workerstart_check")
        if marker is None or "ws_context" not in metafunc.fixturenames:
            return
        spec = registry.get(marker.args[0])
        check_id, only = spec.id, spec.contexts
        contexts = [c for c in self.contexts if only is None or c in only]
        if self.settings.profile == "quick":
            # forkserver (with preload) unless the clause says it is about spawn too; a
            # clause with a parallel path runs where the loader declares parallel start
            wanted = spec.quick_contexts
            declared = self.loader.parallel_contexts()
            if spec.parallel_path and declared and not set(wanted) & set(declared):
                wanted = declared
            quick = [c for c in contexts if c in wanted]
            contexts = quick or contexts[:1]
        if not contexts:
            # An empty parameter set would become pytest's NOTSET: say why instead.
            reason = (f"{check_id} runs only in {', '.join(only)}, which is not among the selected contexts "
                      f"({', '.join(self.contexts)})")
            metafunc.parametrize("ws_context", [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
                                 ids=[f"{check_id}-none"])
            return
        metafunc.parametrize("ws_context", contexts, ids=[f"{check_id}-{c}" for c in contexts])
        if "ws_point" in metafunc.fixturenames:
            from pytest_workerstart import explore

            metafunc.parametrize("ws_point", explore.cases(check_id, self.settings))

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        available = set(protocol.available_contexts())
        for item in items:
            marker = item.get_closest_marker("workerstart_check")
            if marker is None:
                continue
            spec = registry.get(marker.args[0])
            check_id = spec.id
            ctx = item.callspec.params.get("ws_context") if hasattr(item, "callspec") else None
            item.user_properties.append(("workerstart_check", check_id))
            item.user_properties.append(("workerstart_context", ctx))
            if item.get_closest_marker("timeout") is None:
                # pytest-timeout's signal method fails just this check on a hang.
                item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT_S))
            if ctx and ctx not in available:
                item.add_marker(pytest.mark.skip(reason=f"context {ctx!r} is not available on {platform.system()}"))
                continue
            # What the loader declares is judged when the check starts (check_env):
            # the loader may come from a conftest fixture, known only then.
            if spec.serial_only and os.environ.get("PYTEST_XDIST_WORKER"):
                item.add_marker(pytest.mark.skip(reason="speed checks run serially, never under xdist"))
            case = item.callspec.id.removeprefix(f"{check_id}-") if hasattr(item, "callspec") else None
            # the most specific entry wins: id[context-case], then id[context], then id
            for key in ((check_id, case), (check_id, ctx), (check_id, None)):
                if key[1] != "none" and key in self.settings.xfails:
                    self._matched_xfails.add(key)
                    item.add_marker(pytest.mark.xfail(reason=self.settings.xfails[key], strict=True))
                    break

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            marker = item.get_closest_marker("workerstart_check")
            if marker is not None:
                params = item.callspec.params if hasattr(item, "callspec") else {}
                self.verdict.deselect(item.nodeid, marker.args[0], params.get("ws_context"))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._select(session)
        if self.settings.preflight and self.verdict.records and not self.config.option.collectonly \
                and not self.embedded:
            self._preflight(self.loader)

    def _select(self, session: pytest.Session) -> None:
        for item in session.items:
            marker = item.get_closest_marker("workerstart_check")
            if marker is not None:
                params = item.callspec.params if hasattr(item, "callspec") else {}
                self.verdict.select(item.nodeid, marker.args[0], params.get("ws_context"))
        for key in self.settings.xfails.keys() - self._matched_xfails:
            check, ctx = key
            name = f"{check}[{ctx}]" if ctx else check
            warnings.warn(pytest.PytestConfigWarning(f"--workerstart-xfail entry {name!r} matches no collected check"),
                          stacklevel=1)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """Under xdist the controller never sees items: select from the node ids."""
        for nodeid in ids:
            parsed = parse_nodeid(nodeid)
            if parsed is not None:
                self.verdict.select(nodeid, *parsed)

    # --- fixtures available to the checks ----------------------------------
    @pytest.fixture
    def ws_loader(self, workerstart_loader) -> protocol.LoaderUnderTest:
        """The loader under test: the SPEC of the settings, or what a project's
        ``workerstart_loader`` fixture returns (resolved, and preflown, once)."""
        if workerstart_loader is None:
            return self.loader
        if self._from_fixture is None or self._from_fixture[0] is not workerstart_loader:
            try:
                loader = protocol.from_factory(workerstart_loader)
            except protocol.SpecError as exc:
                raise pytest.UsageError(f"workerstart_loader fixture: {exc}") from None
            self._from_fixture = (workerstart_loader, loader)
            if loader.spec != self.loader.spec:
                self.adopt(loader)
        return self.loader

    def adopt(self, loader: protocol.LoaderUnderTest) -> None:
        """Judge ``loader`` (from a fixture) instead of the settings' SPEC."""
        self.loader = loader
        self._streak.clear()  # a run of failures is one loader's
        self.verdict.loader = loader.describe()
        self.verdict.settings = self._settings_record()
        if self.settings.preflight and loader.spec not in self._preflown:
            self._preflight(loader)

    @pytest.fixture
    def ws_settings(self) -> Settings:
        return self.settings

    @pytest.fixture
    def ws_step_timeout(self):
        return self.step_timeout

    @pytest.fixture
    def ws_boot_cost(self):
        return self.measured_boot_cost

    @pytest.fixture
    def ws_lookahead(self):
        return self.lookahead

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        try:
            return (yield)
        finally:
            # no scenario run ahead outlives the run of checks it was planned for
            if not self.lookahead.may_run_beside(item, nextitem):
                self.lookahead.drain()

    def step_timeout(self, num_workers: int) -> float:
        """Seconds one in-process step that waits on the loader may take."""
        if self.settings.step_timeout is not None:
            return self.settings.step_timeout
        return max(STEP_FLOOR_S, STEP_BASE_S + STEP_BOOTS * self.measured_boot_cost() * max(1, num_workers))

    def measured_boot_cost(self) -> float:
        """Seconds one spawn worker's boot takes in this run: the unit of every derived wait."""
        if self.boot_cost is None:
            from pytest_workerstart.probes.deadline import measure_boot_cost

            self.boot_cost = measure_boot_cost()
        return self.boot_cost

    # --- preflight and circuit breaker ---------------------------------------
    def _preflight(self, loader: protocol.LoaderUnderTest) -> None:
        """Build the loader and fetch one batch in a scenario process, before any check.

        A loader that cannot do that (rejects the suite's datasets, raises,
        hangs, crashes the driver) would fail every check the same way, slowly:
        stop with one line instead, and a verdict that says why nothing ran.
        """
        from pytest_workerstart import scenarios

        self._preflown.add(loader.spec)
        ctx = self.contexts[0]
        p = 2 if loader.has("parallel_start", ctx) else None
        timeout = self.settings.step_timeout or PREFLIGHT_TIMEOUT_S
        from pytest_workerstart.probes.deadline import memory_limit_bytes

        res = scenarios.run(loader, ctx, "preflight", timeout=timeout, num_workers=2, parallelism=p,
                            memory_limit=memory_limit_bytes(self.settings.memory_limit), warm=True)
        problem = scenarios.preflight_problem(res, timeout, loader.parallelism_kwarg if p else None)
        if problem is None:
            self.boot_cost = res.value["boot_s"]
            return
        line = (f"workerstart: preflight: loader {loader.spec} ({loader.qualname}, {ctx}, num_workers=2): "
                f"{problem}; no check ran. How to adapt a loader: {ADAPTER_DOCS}")
        self.verdict.not_run_reason = line.removeprefix("workerstart: ")
        site = scenarios.failure_site(res)
        self.preflight_failure = [line.split("; no check ran")[0]]
        if site is not None:
            self.preflight_failure.append(f"workerstart: where: {site}")
        self.preflight_failure.append(f"workerstart: fix: the loader must build from the suite's dataset and "
                                      f"deliver a batch: {ADAPTER_DOCS} says how to adapt one")
        self._write(final=False)
        pytest.exit("workerstart: preflight failed, no check ran", returncode=pytest.ExitCode.USAGE_ERROR)

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function):
        result = yield
        env = pyfuncitem.funcargs.get("check_env")
        if env is not None:
            env.raise_shutdown_failure()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if call.when == "teardown" and item.get_closest_marker("workerstart_check") is not None:
            # --junitxml writes each property with str(): the measurements once more, merged, as JSON
            merged: dict[str, Any] = {}
            for key, value in report.user_properties:
                if key == MEASUREMENTS:
                    merged.update(value)
            report.user_properties.append((f"{MEASUREMENTS}_json", json.dumps(merged, default=str, sort_keys=True)))
        if call.when != "call" or item.get_closest_marker("workerstart_check") is None:
            return report
        if report.passed:
            self._streak.clear()
        elif report.failed and not hasattr(report, "wasxfail"):
            env = getattr(item, "funcargs", {}).get("check_env")
            sig = env.failure_signature(call.excinfo.value) if env is not None and call.excinfo else None
            self._observe_failure(item, sig)
        return report

    def _observe_failure(self, item: pytest.Item, signature: str | None) -> None:
        if signature is None or (self._streak and self._streak[-1][1] != signature):
            self._streak.clear()
        if signature is None:
            return
        self._streak.append((item.nodeid, signature))
        limit = self.settings.circuit_breaker
        if limit and len(self._streak) >= limit:
            reason = (f"circuit breaker: the loader failed the same way ({signature}) in {len(self._streak)} "
                      f"checks in a row; the remaining checks were not run")
            self.verdict.not_run_reason = reason
            item.session.shouldstop = reason

    # --- reporting ---------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        caps = ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}"
                         for k, v in self.loader.capabilities.items())
        return [
            f"workerstart: loader {self.loader.spec} = {self.loader.label}",
            f"workerstart: parallelism kwarg {self.loader.parallelism_kwarg or 'none'}; capabilities {caps}",
            f"workerstart: contexts {','.join(self.contexts)}; profile {self.settings.profile}"
            f"{'; strict' if self.settings.strict else ''}",
        ]

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        """Mark the check running on disk too: if pytest dies in it, the file says where."""
        rec = self.verdict.records.get(nodeid)
        if rec is not None and rec.state == "not_run":
            rec.state = "running"
            self._write(final=False)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        check_id, context = props.get("workerstart_check"), props.get("workerstart_context")
        if check_id is None:
            known = self.verdict.records.get(report.nodeid)  # e.g. xdist's report of a crashed worker
            if known is None:
                return
            check_id, context = known.id, known.context
        rec = self.verdict.apply(report, check_id, context)
        if rec.outcome in ("failed", "error") and rec.reproduce is None:
            failing = ((rec.measurements or {}).get("exploration") or {}).get("failing_point")
            rec.reproduce = self.reproduce(rec.nodeid, context, replay=failing)
        if rec.state == "finished":
            self._write(final=False)

    def reproduce(self, nodeid: str, context: str | None, replay: str | None = None) -> str:
        """The command that reruns exactly this case: this run's settings as options, the case's
        context, the point an exploration failed at, and the case itself (its node id where a
        project's module embeds the checks)."""
        args = ["pytest"] if self.embedded else ["pytest", "--workerstart"]
        args += [a for a in self.settings.as_args() if not (self.embedded and a.startswith("--workerstart-loader="))]
        if context is not None:
            args.append(f"--workerstart-context={context}")
        if replay is not None:
            args.append(f"--workerstart-replay={replay}")
        args += [nodeid] if self.embedded else ["-k", nodeid.rpartition("::")[2]]
        return shlex.join(args)

    def _write(self, *, final: bool, exitstatus: int | None = None) -> None:
        if self._json is not None:
            self.verdict.coverage = self.coverage()
            self.verdict.write(self._json, exitstatus=exitstatus,
                               duration_s=time.monotonic() - self._started, final=final)
        if final and self._json_writer and os.environ.get(STEP_SUMMARY_ENV):
            self._write_step_summary(Path(os.environ[STEP_SUMMARY_ENV]), exitstatus)

    def _write_step_summary(self, path: Path, exitstatus: int | None) -> None:
        """Under GitHub Actions: the verdict's table, appended to the job's summary page."""
        from pytest_workerstart.results_table import render_verdicts

        self.verdict.coverage = self.coverage()
        data = self.verdict.to_json(exitstatus=exitstatus, duration_s=time.monotonic() - self._started, final=True)
        data = json.loads(json.dumps(data, default=str))
        try:
            with path.open("a") as f:
                f.write(f"## workerstart verdict: `{self.loader.spec}`\n\n{render_verdicts([data])}\n")
        except OSError as exc:
            self.config.get_terminal_writer().line(f"workerstart: could not write ${STEP_SUMMARY_ENV}: {exc}")

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if config.option.collectonly:
            return
        report.render(terminalreporter, verdict=self.verdict, loader=self.loader, coverage=self.coverage(),
                      forked_by=self.forked_by(), baseline=self.baseline, preflight_failure=self.preflight_failure,
                      exitstatus=int(exitstatus), tb_hint=config.option.tbstyle == "no",
                      explores=self.settings.explores)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Start the guard that cleans up if pytest itself is killed, and let a SIGTERM end the
        run as Ctrl-C does (the running step's cleanup, then the fixtures' teardown)."""
        from pytest_workerstart.harness import reaper

        reaper.start_guard(verdict=self._json)
        def stop() -> None:
            session.shouldstop = "pytest was sent SIGTERM"

        self._sigterm = reaper.terminate_as_interrupt(stop)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        from pytest_workerstart.harness import reaper, zygote

        self.lookahead.close()
        zygote.shutdown()
        reaper.reap_session()
        if self.settings.repro is not None and self._json_writer:
            self._write_reproducers(self.settings.repro)
        self._write(final=True, exitstatus=int(exitstatus))

    def _write_reproducers(self, directory: Path) -> None:
        from pytest_workerstart import repro

        failed = [r.id for r in self.verdict.records.values()
                  if r.state == "finished" and r.outcome in ("failed", "error")]
        factory = self.loader.factory
        written, missing = repro.write(directory, failed, f"{factory.__module__}:{factory.__qualname__}")
        self.verdict.reproducers = {"directory": str(directory), "written": written, "none_for": missing}

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from pytest_workerstart.harness import reaper

        reaper.restore_sigterm(getattr(self, "_sigterm", None))
        reaper.stop_guard()
