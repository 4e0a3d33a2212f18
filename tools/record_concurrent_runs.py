"""Two full-profile runs at once beside a semaphore churner, compared with a solo verdict.

    python -m tools.record_concurrent_runs SOLO.json [SPEC] [-- PYTEST_ARG ...]

SOLO.json is a verdict of the same loader run alone (e.g. the one ``make bench-suite
SUITE_VERDICTS=DIR`` keeps); SPEC defaults to ``reference``. Starts two ``pytest --workerstart
--workerstart-profile=full -k "not speed"`` runs in their own directories while
:class:`tests._mpprograms.SemaphoreChurner` creates and unlinks named semaphores, then prints each
run's wall time and counts, every case whose outcome differs from the solo run's, and what the
churner lost. The speed ids are left out: the suite refuses to judge speed on a busy machine, by
design. Exit status 0 when both verdicts match the solo one case for case and no semaphore of the
churner vanished. About 12 minutes on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests._mpprograms import SemaphoreChurner

SELECT = "not speed"


def outcomes(verdict: dict) -> dict[str, str]:
    return {c["nodeid"].split("::", 1)[-1]: c["outcome"] for c in verdict["checks"] if not c["id"].startswith("speed.")}


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = argv[:argv.index("--")] if "--" in argv else argv
    solo = outcomes(json.loads(Path(args[0]).read_text()))
    spec = args[1] if len(args) > 1 else "reference"
    with tempfile.TemporaryDirectory(prefix="workerstart-concurrent-") as tmp:
        root = Path(tmp)
        procs, t0 = [], time.monotonic()
        with SemaphoreChurner(root / "churn.json") as churner:
            for k in (1, 2):
                d = root / f"run{k}"
                d.mkdir()
                cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--workerstart",
                       f"--workerstart-loader={spec}", "--workerstart-profile=full", "-k", SELECT,
                       f"--workerstart-json={d / 'verdict.json'}", *extra]
                procs.append((d, subprocess.Popen(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)))
            ends: dict[int, float] = {}
            while len(ends) < len(procs):
                for i, (_d, p) in enumerate(procs):
                    if i not in ends and p.poll() is not None:
                        ends[i] = time.monotonic() - t0
                time.sleep(1.0)
            walls = [ends[i] for i in range(len(procs))]
        same = True
        for (d, p), wall in zip(procs, walls, strict=True):
            got = outcomes(json.loads((d / "verdict.json").read_text()))
            counts = {o: sum(v == o for v in got.values()) for o in ("passed", "failed", "skipped")}
            diff = {k: (solo.get(k), got.get(k)) for k in sorted(set(solo) | set(got)) if solo.get(k) != got.get(k)}
            same &= not diff
            print(f"{d.name}: exit {p.returncode}, {wall:.0f} s, {counts}; differs from the solo run in "
                  f"{len(diff)} case(s)")
            for k, (a, b) in diff.items():
                print(f"  {k}: solo {a}, here {b}")
        print(f"churner: {churner.report}")
    return 0 if same and churner.report["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
