"""Whether recordings of one loader's verdict agree, case by case.

    python -m tools.stability LABEL=VERDICT.json [LABEL=VERDICT.json ...]

Prints a Markdown section: each run (its label, duration and counts), the cases whose outcome
differs between the runs (each run's outcome), and the cases reported unstable (a failed case
whose later run passed: ``unstable: failed k of n``, an outcome of ``failed`` in the verdict).
Exits 1 when a case's outcome differs, or a run did not complete.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_workerstart.results_changes import case_name, outcomes


def _load(arg: str) -> tuple[str, dict]:
    label, sep, path = arg.partition("=")
    if not sep:
        raise SystemExit(f"python -m tools.stability: {arg!r} is not LABEL=VERDICT.json")
    return label, json.loads(Path(path).read_text())


def report(runs: list[tuple[str, dict]]) -> tuple[list[str], bool]:
    """The section's lines, and whether every run completed with the same outcome in every case."""
    lines = ["| run | duration | passed | failed | skipped | unstable |", "|---|---|---|---|---|---|"]
    by_case: dict[str, dict[str, str]] = {}
    unstable: dict[str, list[str]] = {}
    agree = True
    for label, verdict in runs:
        s = verdict.get("summary") or {}
        agree &= bool(verdict.get("complete"))
        mine = [c for c in verdict.get("checks", ()) if (c.get("reason") or "").removeprefix("Failed: ")
                .startswith("unstable:")]
        for c in mine:
            text = c["reason"].removeprefix("Failed: ")[:160]
            unstable.setdefault(case_name(c["nodeid"]), []).append(f"{label}: {text}")
        incomplete = "" if verdict.get("complete") else " (INCOMPLETE)"
        failed = s.get("failed", 0) + s.get("error", 0)
        lines.append(f"| {label}{incomplete} | {verdict.get('duration_s', 0):.0f} s | {s.get('passed', 0)} | {failed} "
                     f"| {s.get('skipped', 0)} "
                     f"| {len(mine)} |")
        for name, outcome in outcomes(verdict).items():
            by_case.setdefault(name, {})[label] = outcome
    labels = [label for label, _ in runs]
    differ = {n: o for n, o in by_case.items() if len({o.get(lb, "absent") for lb in labels}) > 1}
    agree &= not differ
    lines += ["", f"{len(by_case) - len(differ)} of {len(by_case)} cases have the same outcome in every run; "
              f"{len(differ)} differ."]
    if differ:
        lines += ["", "| case | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        lines += [f"| `{n}` | " + " | ".join(o.get(lb, "absent") for lb in labels) + " |"
                  for n, o in sorted(differ.items())]
    if unstable:
        lines += ["", "Reported unstable (failed in the verdict):", ""]
        lines += [f"- `{n}`: " + "; ".join(texts) for n, texts in sorted(unstable.items())]
    return lines, agree


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    lines, agree = report([_load(a) for a in argv])
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
