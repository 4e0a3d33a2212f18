"""Rerun the reproduce command of every explored failure in verdict files, several times each.

    python -m tools.replay_failures VERDICT.json [VERDICT.json ...] [--runs 5] [--every-failure]

``--every-failure``: every failed case, explored or not (a case failed in several verdicts is
rerun once).

Each verdict is replayed in its own folder (a batch's embedded modules live there, and the
reproduce command names their node ids). A case replays when every rerun fails again at the
point the exploration shrank to; the table says how many of the runs did.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def explored_failures(verdict: Path) -> list[dict]:
    checks = json.loads(verdict.read_text())["checks"]
    return [c for c in checks if c["outcome"] == "failed" and ((c.get("measurements") or {}).get("exploration") or {})
            .get("failing_point")]


def every_failure(verdict: Path) -> list[dict]:
    return [c for c in json.loads(verdict.read_text())["checks"] if c["outcome"] == "failed" and c.get("reproduce")]


def replay(case: dict, cwd: Path, runs: int) -> list[str]:
    """The outcome of each rerun of the case's reproduce command, run as printed (with pytest
    started by this interpreter and a verdict file of its own)."""
    args = shlex.split(case["reproduce"])
    outcomes = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="ws-replay-") as d:
            out = Path(d) / "verdict.json"
            subprocess.run([sys.executable, "-m", *args, "-p", "no:cacheprovider", f"--workerstart-json={out}"],
                           cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            checks = json.loads(out.read_text())["checks"] if out.exists() else []
            outcomes.append((checks[0]["outcome"] if checks[0]["outcome"] == "failed"
                             else f"{checks[0]['outcome']}: {checks[0]['reason'][:200]}")
                            if len(checks) == 1 else f"{len(checks)} cases")
    return outcomes


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.replay_failures")
    p.add_argument("verdicts", nargs="+", type=Path)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--every-failure", action="store_true", help="every failed case, not only explored ones")
    a = p.parse_args(argv)
    print("| case | failing point | reruns failed |\n|---|---|---|")
    bad, seen = 0, set()
    for verdict in a.verdicts:
        for case in (every_failure if a.every_failure else explored_failures)(verdict):
            if case["reproduce"] in seen:
                continue
            seen.add(case["reproduce"])
            outcomes = replay(case, verdict.parent, a.runs)
            failed = outcomes.count("failed")
            bad += failed != a.runs
            point = ((case.get("measurements") or {}).get("exploration") or {}).get("failing_point")
            print(f"| `{case['nodeid'].rpartition('/')[2]}` | {f'`{point}`' if point else '-'} "
                  f"| {failed} of {a.runs}{'' if failed == a.runs else ' ' + repr(outcomes)} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
