"""Judge many loaders in one suite run: one embedded-mode module per loader.

Each loader gets a test module that imports only the check functions of the ids
selected for it and overrides ``workerstart_loader`` for that module (the way a
project embeds the suite, docs/adapter.md), so one pytest start, one torch
import and one zygote serve every loader of the batch, while each loader is
preflown and judged on its own. The verdict's node ids say which module, so
which loader, each case belongs to.

A batch that ends early (a loader that crashes the driving process, a hang past
the run's limit) leaves loaders whose checks never finished; :func:`judge`
reruns each of those alone, so one loader's crash fails only its own test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests import _warm

#: node-id prefix of a batch module
PREFIX = "test_ws_"


def check_functions() -> dict[str, list[tuple[str, str]]]:
    """check id -> [(conformance module, function name)] of the functions that carry its marker."""
    from pytest_workerstart.conformance import by_check_id

    return {i: [(fn.__module__.removeprefix("pytest_workerstart.conformance."), name) for name, fn in fns]
            for i, fns in by_check_id().items()}


def module_source(spec: str, ids: Iterable[str]) -> str:
    funcs = check_functions()
    lines = ["import pytest", ""]
    for check_id in sorted(set(ids)):
        for module, name in funcs[check_id]:
            lines.append(f"from pytest_workerstart.conformance.{module} import {name}  # noqa: F401")
    lines += ["", "", "@pytest.fixture(scope='module')", "def workerstart_loader():", f"    return {spec!r}", ""]
    return "\n".join(lines)


class Slice:
    """One loader's part of a batch verdict (the interface of tests.conftest.Verdict)."""

    def __init__(self, checks: list[dict], output: str, complete: bool):
        self.checks = checks
        self.output = output
        self.complete = complete

    def outcomes(self, check_id: str) -> list[str | None]:
        return [c["outcome"] for c in self.checks if c["id"] == check_id]

    def failed_ids(self) -> set[str]:
        return {c["id"] for c in self.checks if c["outcome"] in ("failed", "error")}

    def describe(self) -> str:
        """Each case's outcome and reason, then the end of the run's output."""
        cases = "\n".join(f"  {c['nodeid'].partition('::')[2]}: {c['outcome']} {c['reason'][:300]}"
                          for c in self.checks)
        return f"{cases}\n{self.output[-2000:]}"

    def finished(self) -> bool:
        return bool(self.checks) and all(c["state"] == "finished" for c in self.checks)


def run_batch(directory: Path, entries: dict[str, tuple[str, Sequence[str]]], args: Sequence[str],
              timeout: float) -> dict[str, Slice]:
    """``entries``: name -> (loader SPEC, check ids). One suite run in ``directory``; each name's Slice."""
    from tests.conftest import validate_verdict

    directory.mkdir(parents=True, exist_ok=True)
    for name, (spec, ids) in entries.items():
        (directory / f"{PREFIX}{name}.py").write_text(module_source(spec, ids))
    out = directory / "verdict.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={directory / 'basetemp'}",
           f"--workerstart-json={out}", *args]
    log = directory / "output.txt"
    # Output to a file, not a pipe: a loader's leaked process may keep a pipe open after pytest exits.
    with log.open("w") as f:
        proc = _warm.popen(cmd, cwd=directory, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout)
            ended = ""
        except subprocess.TimeoutExpired:
            proc.kill()  # its guard process cleans up what the suite started
            proc.wait()
            ended = f"\nthe batch run exceeded {timeout} s and was killed"
    output = log.read_text() + ended
    data = json.loads(out.read_text()) if out.exists() else {"checks": [], "complete": False}
    if data["checks"]:
        validate_verdict(data)
    return {name: Slice([c for c in data["checks"] if c["nodeid"].startswith(f"{PREFIX}{name}.py::")], output,
                        data["complete"]) for name in entries}


def judge(directory: Path, entries: dict[str, tuple[str, Sequence[str]]], args: Sequence[str],
          timeout: float) -> dict[str, Slice]:
    """:func:`run_batch`, then each loader whose checks did not all finish rerun alone."""
    slices = run_batch(directory / "batch", entries, args, timeout)
    for name, got in slices.items():
        if not got.finished():
            slices[name] = run_batch(directory / f"alone-{name}", {name: entries[name]}, args, timeout)[name]
    return slices
