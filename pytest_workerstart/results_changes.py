"""What changed between two recordings of a loader's verdict: ``python -m pytest_workerstart.results_changes OLD NEW``.

OLD and NEW are verdict files, or two folders whose verdict files of the same name are compared
(a file only in NEW is a new recording, as is a NEW whose OLD does not exist; one only in OLD was
not re-recorded). For each: when it was recorded, the versions (the loader's, torch's, the
plugin's, the verdict format), and each case whose outcome changed, appeared or went away, case
by case by node id. Exits 1 when a run in NEW did not complete: its file is not a verdict to
publish.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def case_name(nodeid: str) -> str:
    """``test_x.py::test_y[params]``: a node id without the folders pytest reported it from (a
    run's rootdir decides whether it is ``conformance/x/test_x.py`` or ``test_x.py``)."""
    path, sep, rest = nodeid.partition("::")
    return f"{path.rpartition('/')[2]}{sep}{rest}"


def outcomes(verdict: dict[str, Any]) -> dict[str, str]:
    """Each case's outcome (its state where it has none), by :func:`case_name`."""
    return {case_name(c["nodeid"]): c.get("outcome") or c.get("state") or "?" for c in verdict.get("checks", ())}


def _versions(verdict: dict[str, Any]) -> dict[str, str]:
    loader = verdict.get("loader") or {}
    return {"recorded": verdict.get("started") or "before 0.6 (no date)",
            "loader": f"{loader.get('package') or loader.get('spec')} {loader.get('version')}",
            "torch": str((verdict.get("machine") or {}).get("torch")),
            "plugin": str(verdict.get("plugin_version")), "format": str(verdict.get("version"))}


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Lines saying what differs from ``old`` (None: never recorded) to ``new``; the first says
    ``INCOMPLETE`` where ``new``'s run did not finish (a crash, an interrupt, a usage error)."""
    name = (new.get("loader") or {}).get("spec", "?")
    if not new.get("complete"):
        name = f"{name}: INCOMPLETE (outcome {new.get('outcome')}, exit status {new.get('exitstatus')})"
    if old is None:
        counts = ", ".join(f"{v} {k}" for k, v in (new.get("summary") or {}).items() if v)
        return [f"{name}: first recording ({counts})"]
    before, after = _versions(old), _versions(new)
    lines = [f"{name}: " + "; ".join(f"{k} {before[k]} -> {after[k]}" if before[k] != after[k] else f"{k} {after[k]}"
                                     for k in after)]
    was, now = outcomes(old), outcomes(new)
    changed = [f"  {n}: {was[n]} -> {now[n]}" for n in sorted(was.keys() & now.keys()) if was[n] != now[n]]
    added = [f"  new {n}: {now[n]}" for n in sorted(now.keys() - was.keys())]
    gone = [f"  gone {n} (was {was[n]})" for n in sorted(was.keys() - now.keys())]
    same = len(was.keys() & now.keys()) - len(changed)
    lines.append(f"  {same} cases as before, {len(changed)} changed, {len(added)} new, {len(gone)} gone")
    return lines + changed + added + gone


def compare(old: Path, new: Path) -> list[str]:
    """``changes`` for two files, or for each verdict file of folder ``new`` against ``old``'s of the same name."""
    if new.is_dir():
        out: list[str] = []
        for path in sorted(new.glob("*.json")):
            out += compare(old / path.name, path)
        return out
    return changes(json.loads(old.read_text()) if old.is_file() else None, json.loads(new.read_text()))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m pytest_workerstart.results_changes OLD NEW (two verdict files or folders)\n")
        return 2
    lines = compare(Path(argv[0]), Path(argv[1]))
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 1 if any(": INCOMPLETE" in line for line in lines if not line.startswith(" ")) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
