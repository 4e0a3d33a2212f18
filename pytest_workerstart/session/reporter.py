"""What a ``--workerstart`` run says: the header, each finished case into the verdict (with the
command that reruns it), the verdict file after every case, the terminal summary, the
reproducers, and under GitHub Actions the job summary."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import registry, report, repro
from pytest_workerstart.results_table import render_verdicts
from pytest_workerstart.verdict import one_property_per_measurement

#: GitHub Actions names the job summary file here; the final verdict's table is appended to it
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


class VerdictReporter:
    """A plugin of its own: ``run`` is the :class:`WorkerstartSession` whose verdict it keeps."""

    def __init__(self, run: Any):
        self._run = run
        self._started = time.monotonic()
        # Under xdist only the controller writes the verdict (and reproducers).
        self.writer = not hasattr(run.config, "workerinput")
        self.json_path = run.settings.json_path if self.writer else None

    @property
    def verdict(self):
        return self._run.verdict

    # --- derived from the verdict's records ----------------------------------
    def coverage(self) -> dict[str, dict[str, str]]:
        """Per context that ran, per clause: "parallel" if a check of it ran (passed or
        failed) where the loader declares parallel start, else "serial"."""
        declared = set(self._run.loader.parallel_contexts())
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

    def reproduce(self, nodeid: str, context: str | None, replay: str | None = None) -> str:
        """The command that reruns exactly this case: this run's settings as options, the case's
        context, the point an exploration failed at, and the case itself (its node id where a
        project's module embeds the checks)."""
        embedded = self._run.embedded
        args = ["pytest"] if embedded else ["pytest", "--workerstart"]
        args += [a for a in self._run.settings.as_args() if not (embedded and a.startswith("--workerstart-loader="))]
        if context is not None:
            args.append(f"--workerstart-context={context}")
        if replay is not None:
            args.append(f"--workerstart-replay={replay}")
        args += [nodeid] if embedded else ["-k", nodeid.rpartition("::")[2]]
        return shlex.join(args)

    # --- hooks -----------------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        loader, settings = self._run.loader, self._run.settings
        caps = ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in loader.capabilities.items())
        return [
            f"workerstart: loader {loader.spec} = {loader.label}",
            f"workerstart: parallelism kwarg {loader.parallelism_kwarg or 'none'}; capabilities {caps}",
            f"workerstart: contexts {','.join(self._run.contexts)}; profile {settings.profile}"
            f"{'; strict' if settings.strict else ''}",
        ]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if call.when == "teardown" and item.get_closest_marker("workerstart_check") is not None:
            report.user_properties = one_property_per_measurement(report.user_properties)
        return report

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        """Mark the check running on disk too: if pytest dies in it, the file says where."""
        rec = self.verdict.records.get(nodeid)
        if rec is not None and rec.state == "not_run":
            rec.state = "running"
            self.write(final=False)

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
            self.write(final=False)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if config.option.collectonly:
            return
        run = self._run
        report.render(terminalreporter, verdict=self.verdict, loader=run.loader, coverage=self.coverage(),
                      forked_by=self.forked_by(), baseline=run.baseline, preflight_failure=run.preflight_failure,
                      exitstatus=int(exitstatus), tb_hint=config.option.tbstyle == "no",
                      explores=run.settings.explores)

    # --- files -----------------------------------------------------------------
    def write(self, *, final: bool, exitstatus: int | None = None) -> None:
        if self.json_path is not None:
            self.verdict.coverage = self.coverage()
            self.verdict.write(self.json_path, exitstatus=exitstatus,
                               duration_s=time.monotonic() - self._started, final=final)
        if final and self.writer and os.environ.get(STEP_SUMMARY_ENV):
            self._write_step_summary(Path(os.environ[STEP_SUMMARY_ENV]), exitstatus)

    def _write_step_summary(self, path: Path, exitstatus: int | None) -> None:
        """Under GitHub Actions: the verdict's table, appended to the job's summary page."""
        self.verdict.coverage = self.coverage()
        data = self.verdict.to_json(exitstatus=exitstatus, duration_s=time.monotonic() - self._started, final=True)
        data = json.loads(json.dumps(data, default=str))
        try:
            with path.open("a") as f:
                f.write(f"## workerstart verdict: `{self._run.loader.spec}`\n\n{render_verdicts([data])}\n")
        except OSError as exc:
            self._run.config.get_terminal_writer().line(f"workerstart: could not write ${STEP_SUMMARY_ENV}: {exc}")

    def write_reproducers(self, directory: Path) -> None:
        if not self.writer:
            return

        failed = [r.id for r in self.verdict.records.values()
                  if r.state == "finished" and r.outcome in ("failed", "error")]
        factory = self._run.loader.factory
        written, missing = repro.write(directory, failed, f"{factory.__module__}:{factory.__qualname__}")
        self.verdict.reproducers = {"directory": str(directory), "written": written, "none_for": missing}
