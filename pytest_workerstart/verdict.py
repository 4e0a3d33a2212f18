"""The verdict of one run: what each selected check did, and nothing more.

A :class:`CheckRecord` starts ``not_run`` with no outcome. Phase reports move
it to ``running`` and then, with its teardown report, to ``finished``; only a
finished check has an outcome. A run that ends early (Ctrl-C, a crash of the
process driving the loader, a circuit breaker) therefore says which checks
never finished instead of claiming they passed.

The file is rewritten (atomically) each time a check finishes, so even a
pytest process that dies leaves the last consistent state, marked
``complete: false``. ``verdict.schema.json`` beside this module is the format;
``VERSION`` is its contract version.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Version of the verdict format (``verdict.schema.json``); bumped on any change.
VERSION = "0.6"
SCHEMA_PATH = Path(__file__).with_name("verdict.schema.json")
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "error")
STATES = ("finished", "running", "not_run")
_PARAM_ID = re.compile(r"\[(?P<id>[a-z_]+\.[a-z_]+)-(?P<ctx>[a-z]+)")


def parse_nodeid(nodeid: str) -> tuple[str, str | None] | None:
    """(check id, context) from a check's node id (its first parameter id)."""
    m = _PARAM_ID.search(nodeid)
    if not m:
        return None
    return m["id"], (None if m["ctx"] == "none" else m["ctx"])


def case_key(nodeid: str, check_id: str) -> str:
    """``check.id[context-case]`` from a check's node id (what failure lines, expected
    failures and baselines name a case by, whatever directory the node id is from)."""
    params = nodeid.partition(f"[{check_id}-")[2].rstrip("]")
    return f"{check_id}[{params}]" if params else check_id


MEASUREMENTS = "workerstart_measurements"


def record_measurements(node: pytest.Item, **values: Any) -> None:
    """Attach JSON-able series to the verdict record of the running check."""
    node.user_properties.append((MEASUREMENTS, values))


def _is_measurement(key: str) -> bool:
    return key == MEASUREMENTS or key.startswith(f"{MEASUREMENTS}.")


def _measured(properties) -> dict[str, Any]:
    """The measurements among a report's properties, merged (the last value of a name wins):
    dicts recorded by :func:`record_measurements`, or the JSON properties below."""
    out: dict[str, Any] = {}
    for key, value in properties:
        if key == MEASUREMENTS:
            out.update(value)
        elif _is_measurement(key):
            out[key.partition(".")[2]] = json.loads(value)
    return out


def one_property_per_measurement(properties: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The check's properties with each measurement as one ``workerstart_measurements.NAME``
    property whose value is JSON: what ``--junitxml`` writes (it writes each value with ``str()``)."""
    rest = [(key, value) for key, value in properties if not _is_measurement(key)]
    return rest + [(f"{MEASUREMENTS}.{name}", json.dumps(value, default=str, sort_keys=True))
                   for name, value in _measured(properties).items()]


@dataclasses.dataclass
class CheckRecord:
    nodeid: str
    id: str
    context: str | None
    state: str = "not_run"
    outcome: str | None = None
    reason: str = ""
    duration_s: float = 0.0
    #: what the baseline verdict (``--workerstart-baseline``) got for this case, if one was given
    baseline_outcome: str | None = None
    #: what the check measured, from ``request.node.user_properties`` entries
    #: ``("workerstart_measurements", {name: value})`` (see :func:`record_measurements`)
    measurements: dict[str, Any] | None = None
    #: a shell command that reruns exactly this case with the same loader, context and
    #: settings (failed and error cases; set by the session)
    reproduce: str | None = None

    def apply(self, report: pytest.TestReport) -> None:
        """Fold one phase report (setup, call, teardown) into the record."""
        self.duration_s = round(self.duration_s + report.duration, 3)
        measured = _measured(getattr(report, "user_properties", ()))
        if measured:
            self.measurements = {**(self.measurements or {}), **measured}
        if report.when not in ("setup", "call", "teardown"):  # xdist: the worker running it crashed
            self.state, self.outcome = "finished", "error"
            self.reason = f"crashed: {str(report.longrepr).strip().splitlines()[0][:400]}"
            return
        if report.when == "teardown":
            self.state = "finished"
        else:
            self.state = "running"
        if hasattr(report, "wasxfail"):
            if report.skipped:
                self.outcome, self.reason = "xfailed", report.wasxfail
            elif report.failed:  # strict XPASS
                self.outcome, self.reason = "failed", f"[XPASS(strict)] {report.wasxfail}"
            else:
                self.outcome = self.outcome or "passed"
            return
        if report.skipped and self.outcome is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.outcome, self.reason = "skipped", reason.removeprefix("Skipped: ")
        elif report.failed:
            if self.outcome not in ("failed", "error"):
                self.outcome = "failed" if report.when == "call" else "error"
                self.reason = one_line(report)
        elif report.passed and report.when == "call" and self.outcome is None:
            self.outcome = "passed"
        if self.state == "finished" and self.outcome is None:
            self.outcome, self.reason = "error", "finished without a call report"

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.state != "finished":
            out["outcome"] = None  # only finished checks have an outcome
        return out


#: Worst first: the outcome a table cell shows for several cases of one check.
SEVERITY = ("error", "failed", "not run", "xfailed", "passed", "skipped")


def cell(outcomes: list[str], empty: str = "") -> str:
    """One table cell for the outcomes of a check's cases in one context ("failed 2/3")."""
    if not outcomes:
        return empty
    worst = next(o for o in SEVERITY if o in outcomes)
    n = outcomes.count(worst)
    return worst if n == len(outcomes) else f"{worst} {n}/{len(outcomes)}"


def one_line(report: pytest.TestReport) -> str:
    """The first line of a failure; for an error re-raised from a worker (torch's
    "Caught X in DataLoader worker process N." + "Original Traceback"), with the
    worker's own exception appended, which is what the loader's author needs."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = (crash.message if crash is not None else str(report.longrepr)).strip()
    if not text:
        return "failed"
    lines = text.splitlines()
    first = lines[0][:500]
    if "Original Traceback" in text:
        original = [ln.strip() for ln in text.split("Original Traceback", 1)[1].splitlines() if ln.strip()]
        # only an exception line: a traceback quoted inside a longer message ends elsewhere
        cause = next((ln for ln in reversed(original)
                      if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)), "")
        if cause and cause not in first:
            first = f"{first} (in the worker: {cause[:300]})"
    return first


class Verdict:
    """The records of one run plus what is needed to write the file."""

    def __init__(self, loader: dict[str, Any], settings: dict[str, Any], baseline: Any = None):
        self.loader = loader
        self.settings = settings
        self.baseline = baseline  # baseline.Baseline or None
        self.records: dict[str, CheckRecord] = {}
        self.deselected: list[dict[str, Any]] = []
        self.not_run_reason = ""
        #: context -> clause -> "parallel" | "serial" (set by the session before each write)
        self.coverage: dict[str, dict[str, str]] = {}
        #: what ``--workerstart-repro`` wrote (None: not asked)
        self.reproducers: dict[str, Any] | None = None
        #: when the run began (UTC): a published verdict says when it was recorded
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def select(self, nodeid: str, check_id: str, context: str | None) -> CheckRecord:
        rec = self.records.get(nodeid)
        if rec is None:
            rec = self.records[nodeid] = CheckRecord(nodeid, check_id, context)
            if self.baseline is not None:
                rec.baseline_outcome = self.baseline.outcome(nodeid, check_id)
        return rec

    def deselect(self, nodeid: str, check_id: str, context: str | None) -> None:
        self.deselected.append({"id": check_id, "context": context, "nodeid": nodeid})

    def apply(self, report: pytest.TestReport, check_id: str, context: str | None) -> CheckRecord:
        rec = self.select(report.nodeid, check_id, context)
        rec.apply(report)
        return rec

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys((*OUTCOMES, "not_run"), 0)
        for r in self.records.values():
            counts[r.outcome if r.state == "finished" else "not_run"] += 1
        return counts

    def finished(self) -> bool:
        return all(r.state == "finished" for r in self.records.values())

    def contexts_run(self) -> list[str]:
        """Contexts in which at least one check ran to a pass or a failure."""
        ran = {r.context for r in self.records.values()
               if r.state == "finished" and r.outcome not in ("skipped", None) and r.context}
        return [c for c in ("spawn", "forkserver", "fork") if c in ran]

    def judged_points(self) -> dict[str, list[dict[str, Any]]]:
        """Per check id, the points its passed, failed or xfailed cases judged (skipped and
        errored cases judged nothing), each with its origin and the contexts it was judged in."""
        found: dict[str, dict[tuple[str, str], set[str]]] = {}
        for r in self.records.values():
            if r.state != "finished" or r.outcome not in ("passed", "failed", "xfailed"):
                continue
            for p in (r.measurements or {}).get("points", ()):
                contexts = found.setdefault(r.id, {}).setdefault((p["point"], p["origin"]), set())
                if r.context:
                    contexts.add(r.context)
        return {check_id: [{"point": point, "origin": origin, "contexts": sorted(ctxs)}
                           for (point, origin), ctxs in sorted(points.items())]
                for check_id, points in sorted(found.items())}

    def to_json(self, *, exitstatus: int | None, duration_s: float, final: bool) -> dict[str, Any]:
        complete = final and exitstatus in (0, 1) and self.finished()
        counts = self.summary()
        if not final:
            overall = "running"
        elif not complete:
            overall = "incomplete"
        elif counts["failed"] or counts["error"]:
            overall = "failed"
        elif counts["passed"] == 0:
            overall = "empty"
        else:
            overall = "passed"
        checks = []
        for r in self.records.values():
            entry = r.as_json()
            if r.state != "finished" and final:
                entry["reason"] = self.not_run_reason or (
                    "interrupted while running" if r.state == "running" else
                    f"never ran: the session ended first (exit status {exitstatus})")
            checks.append(entry)
        return {
            "version": VERSION,
            "plugin_version": plugin_version(),
            "started": self.started,
            "complete": complete,
            "outcome": overall,
            "exitstatus": exitstatus,
            "loader": self.loader,
            "machine": machine_description(),
            "settings": {**self.settings, "contexts_run": self.contexts_run()},
            "checks": checks,
            "selected_ids": sorted({r.id for r in self.records.values()}),
            "deselected": self.deselected,
            "deselected_ids": sorted({d["id"] for d in self.deselected} - {r.id for r in self.records.values()}),
            "coverage": self.coverage,
            "points": self.judged_points(),
            "baseline": None if self.baseline is None else {
                "source": self.baseline.source, "loader": self.baseline.loader, "torch": self.baseline.torch,
                "profile": self.baseline.profile, **self.baseline.compare(self.records.values())},
            "summary": counts,
            "reproducers": self.reproducers,
            "duration_s": round(duration_s, 3),
        }

    def write(self, path: Path, **kwargs: Any) -> None:
        """Replace ``path`` atomically: a reader never sees half a verdict."""
        text = json.dumps(self.to_json(**kwargs), indent=2, default=str) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".verdict-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def plugin_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-workerstart")
    except PackageNotFoundError:
        return "unknown"


def machine_description() -> dict[str, Any]:
    import multiprocessing

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": multiprocessing.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    return info


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())
