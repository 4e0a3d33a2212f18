"""What ``--workerstart`` adds to a pytest session.

Resolves settings and the loader (usage errors exit 4 with one line), adds the
suite to the collected paths, parametrizes every ``workerstart_check`` over the
selected contexts, turns declared requirements into skips with reasons, applies
the expected-failure file, and reports: header, per-check table, JSON verdict.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import protocol
from pytest_workerstart.plugin import resolve_loader_spec

SUITE_DIR = Path(__file__).resolve().parent / "conformance"
if not SUITE_DIR.is_dir():  # running from a source checkout (editable install)
    SUITE_DIR = Path(__file__).resolve().parent.parent / "conformance"

#: Per-check hard limit (pytest-timeout) unless the check sets its own.
CHECK_TIMEOUT_S = 300
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "error")
_XFAIL_LINE = re.compile(r"^(?P<id>[a-z_]+\.[a-z_]+)(\[(?P<ctx>[a-z]+)\])?\s*:\s*(?P<reason>.*)$")


@dataclasses.dataclass
class Settings:
    """Resolved ``--workerstart-*`` options, available to checks as ``ws.settings``."""

    contexts: tuple[str, ...]
    profile: str = "full"
    strict: bool = False
    min_speedup: float | None = None
    driver_death_timeout: float = 15.0
    json_path: Path | None = None
    xfails: dict[tuple[str, str | None], str] = dataclasses.field(default_factory=dict)


def _usage(msg: str) -> pytest.UsageError:
    return pytest.UsageError(msg)


def _parse_xfail_file(path: str) -> dict[tuple[str, str | None], str]:
    p = Path(path)
    if not p.is_file():
        raise _usage(f"--workerstart-xfail: no such file {path!r}")
    entries: dict[tuple[str, str | None], str] = {}
    for lineno, raw in enumerate(p.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        m = _XFAIL_LINE.match(line)
        if not m:
            raise _usage(f"{path}:{lineno}: expected 'check.id[context]: reason', got {raw.strip()!r}")
        if not m["reason"].strip():
            raise _usage(f"{path}:{lineno}: expected failure of {m['id']} needs a reason")
        entries[(m["id"], m["ctx"])] = m["reason"].strip()
    return entries


def _check_json_path(path: str) -> Path:
    p = Path(path).expanduser().resolve()
    parent = p.parent
    if not parent.is_dir():
        raise _usage(f"--workerstart-json: directory {str(parent)!r} does not exist")
    if (p.exists() and not os.access(p, os.W_OK)) or not os.access(parent, os.W_OK):
        raise _usage(f"--workerstart-json: {str(p)!r} is not writable")
    if p.is_dir():
        raise _usage(f"--workerstart-json: {str(p)!r} is a directory")
    return p


class WorkerstartSession:
    def __init__(self, config: pytest.Config, loader: protocol.LoaderUnderTest, settings: Settings):
        self.config = config
        self.loader = loader
        self.settings = settings
        self.results: dict[str, dict[str, Any]] = {}
        self._matched_xfails: set[tuple[str, str | None]] = set()
        self._started = time.monotonic()

    # --- configuration -----------------------------------------------------
    @classmethod
    def from_config(cls, config: pytest.Config) -> "WorkerstartSession":
        opt = config.getoption
        try:
            overrides: dict[str, Any] = {}
            for item in list(config.getini("workerstart_capabilities")) + list(opt("workerstart_capability")):
                name, value = protocol.parse_capability(item)
                overrides[name] = value
            ctx_value = opt("workerstart_context") or config.getini("workerstart_context")
            contexts = protocol.parse_contexts(ctx_value) if ctx_value else protocol.available_contexts()
            loader = protocol.resolve(resolve_loader_spec(config), opt("workerstart_parallelism_kwarg"), overrides)
        except protocol.SpecError as exc:
            raise _usage(str(exc)) from None
        profile = opt("workerstart_profile") or config.getini("workerstart_profile") or "full"
        if profile not in ("quick", "full"):
            raise _usage(f"workerstart_profile: expected quick or full, got {profile!r}")
        strict = opt("workerstart_strict")
        if strict is None:
            strict = bool(config.getini("workerstart_strict"))
        ddt = opt("workerstart_driver_death_timeout")
        if ddt is None:
            ddt = float(config.getini("workerstart_driver_death_timeout") or 15.0)
        settings = Settings(
            contexts=contexts,
            profile=profile,
            strict=strict,
            min_speedup=opt("workerstart_min_speedup"),
            driver_death_timeout=ddt,
            json_path=_check_json_path(opt("workerstart_json")) if opt("workerstart_json") else None,
            xfails=_parse_xfail_file(opt("workerstart_xfail")) if opt("workerstart_xfail") else {},
        )
        # torch warns when num_workers exceeds the cores; the suite does that on purpose.
        config.addinivalue_line("filterwarnings", "ignore:This DataLoader will create:UserWarning")
        self = cls(config, loader, settings)
        self._add_suite_path()
        return self

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
        check_id = marker.args[0]
        only = marker.kwargs.get("contexts")
        contexts = [c for c in self.settings.contexts if only is None or c in only]
        if self.settings.profile == "quick":
            # forkserver (with preload) unless the clause says it is about spawn too
            wanted = marker.kwargs.get("quick_contexts", ("forkserver",))
            quick = [c for c in contexts if c in wanted]
            contexts = quick or contexts[:1]
        metafunc.parametrize("ws_context", contexts, ids=[f"{check_id}-{c}" for c in contexts])

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        available = set(protocol.available_contexts())
        for item in items:
            marker = item.get_closest_marker("workerstart_check")
            if marker is None:
                continue
            check_id = marker.args[0]
            ctx = item.callspec.params.get("ws_context") if hasattr(item, "callspec") else None
            item.user_properties.append(("workerstart_check", check_id))
            item.user_properties.append(("workerstart_context", ctx))
            if item.get_closest_marker("timeout") is None:
                # pytest-timeout's signal method fails just this check on a hang.
                item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT_S))
            if ctx and ctx not in available:
                item.add_marker(pytest.mark.skip(reason=f"context {ctx!r} is not available on {platform.system()}"))
                continue
            if marker.kwargs.get("needs_parallelism_kwarg") and self.loader.parallelism_kwarg is None:
                item.add_marker(pytest.mark.skip(
                    reason="loader does not declare capability 'parallel_start' (no parallelism keyword)"))
                continue
            for cap in marker.kwargs.get("requires", ()):
                if not self.loader.has(cap, ctx if protocol.CAPABILITIES[cap][0] == "contexts" else None):
                    where = f" for context {ctx!r}" if protocol.CAPABILITIES[cap][0] == "contexts" else ""
                    item.add_marker(pytest.mark.skip(
                        reason=f"loader does not declare capability {cap!r}{where}"))
                    break
            if marker.kwargs.get("serial_only") and os.environ.get("PYTEST_XDIST_WORKER"):
                item.add_marker(pytest.mark.skip(reason="speed checks run serially, never under xdist"))
            for key in ((check_id, ctx), (check_id, None)):
                if key in self.settings.xfails:
                    self._matched_xfails.add(key)
                    item.add_marker(pytest.mark.xfail(reason=self.settings.xfails[key], strict=True))
                    break

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for key in self.settings.xfails.keys() - self._matched_xfails:
            check, ctx = key
            name = f"{check}[{ctx}]" if ctx else check
            warnings.warn(pytest.PytestConfigWarning(f"--workerstart-xfail entry {name!r} matches no collected check"))

    # --- fixtures available to the checks ----------------------------------
    @pytest.fixture
    def ws_loader(self) -> protocol.LoaderUnderTest:
        return self.loader

    @pytest.fixture
    def ws_settings(self) -> Settings:
        return self.settings

    # --- reporting ---------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        caps = ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in self.loader.capabilities.items())
        return [
            f"workerstart: loader {self.loader.spec} = {self.loader.qualname} {self.loader.version}",
            f"workerstart: parallelism kwarg {self.loader.parallelism_kwarg or 'none'}; capabilities {caps}",
            f"workerstart: contexts {','.join(self.settings.contexts)}; profile {self.settings.profile}"
            f"{'; strict' if self.settings.strict else ''}",
        ]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        check_id = props.get("workerstart_check")
        if check_id is None:
            return
        entry = self.results.setdefault(report.nodeid, {
            "id": check_id, "context": None, "outcome": "passed", "reason": "", "duration_s": 0.0,
            "nodeid": report.nodeid,
        })
        entry["context"] = props.get("workerstart_context")
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
        if hasattr(report, "wasxfail"):
            if report.skipped:
                entry["outcome"], entry["reason"] = "xfailed", report.wasxfail
            elif report.failed:  # strict XPASS
                entry["outcome"], entry["reason"] = "failed", f"[XPASS(strict)] {report.wasxfail}"
            return
        if report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["reason"] = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            entry["reason"] = entry["reason"].removeprefix("Skipped: ")
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["reason"] = _one_line(report)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        tr = terminalreporter
        if not self.results:
            tr.write_sep("=", "workerstart: no conformance check ran", red=True)
            return
        contexts = [c for c in protocol.KNOWN_CONTEXTS if any(r["context"] == c for r in self.results.values())]
        table: dict[str, dict[str, list[str]]] = {}
        for r in self.results.values():
            table.setdefault(r["id"], {}).setdefault(r["context"] or "-", []).append(r["outcome"])
        tr.write_sep("=", f"workerstart verdict: {self.loader.spec} ({self.loader.qualname} {self.loader.version})")
        width = max(len(k) for k in table) + 2
        tr.write_line("check".ljust(width) + "".join(c.ljust(12) for c in contexts))
        for check_id in sorted(table):
            cells = []
            for c in contexts:
                outs = table[check_id].get(c, [])
                cells.append(_cell(outs).ljust(12))
            tr.write_line(check_id.ljust(width) + "".join(cells))
        counts = self.summary()
        tr.write_line("")
        tr.write_line("workerstart: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES))
        reasons: dict[str, int] = {}
        for r in self.results.values():
            if r["outcome"] == "skipped":
                reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        for reason, n in sorted(reasons.items()):
            tr.write_line(f"  skipped {n}x: {reason}")
        if counts["passed"] == 0:
            tr.write_line("workerstart: WARNING: no check passed; this verdict covers nothing", red=True)

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for r in self.results.values():
            counts[r["outcome"]] += 1
        return counts

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        from pytest_workerstart.probes import reaper

        reaper.reap_session()
        if self.settings.json_path is None:
            return
        verdict = {
            "loader": self.loader.describe(),
            "machine": machine_description(),
            "settings": {"contexts": list(self.settings.contexts), "profile": self.settings.profile,
                         "strict": self.settings.strict},
            "checks": [{k: r[k] for k in ("id", "context", "outcome", "reason", "duration_s", "nodeid")}
                       for r in self.results.values()],
            "summary": self.summary(),
            "duration_s": round(time.monotonic() - self._started, 3),
        }
        self.settings.json_path.write_text(json.dumps(verdict, indent=2, sort_keys=False) + "\n")


def _cell(outcomes: list[str]) -> str:
    if not outcomes:
        return ""
    order = ("error", "failed", "xfailed", "passed", "skipped")
    worst = next(o for o in order if o in outcomes)
    n = outcomes.count(worst)
    return worst if len(outcomes) == 1 else f"{worst} {n}/{len(outcomes)}"


def _one_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:500] if text.strip() else "failed"


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
