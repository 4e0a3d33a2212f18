"""Record the speed series the judges are tested on (tests/test_speed_judges.py).

    python -m tools.record_speed_series NAME=SPEC [NAME=SPEC ...]

For each, runs ``pytest --workerstart --workerstart-loader=SPEC --workerstart-context=spawn
--workerstart-profile=full -k speed`` (about three minutes on 2 cores; the machine must be
otherwise idle, or the suite skips the speed checks) and writes ``tests/data/speed/NAME.json``:
the loader, the machine, each speed id's outcome and measured series.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "speed"


def record(name: str, spec: str) -> dict:
    args = [f"--workerstart-loader={spec}", "--workerstart-context=spawn", "--workerstart-profile=full", "-k", "speed"]
    with tempfile.TemporaryDirectory() as tmp:
        verdict = Path(tmp) / "verdict.json"
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--workerstart", *args,
                        f"--workerstart-json={verdict}"], cwd=tmp, check=False)
        v = json.loads(verdict.read_text())
    speed = [c for c in v["checks"] if c["id"].startswith("speed.")]
    skipped = [c["reason"] for c in speed if c["outcome"] == "skipped"]
    if skipped:
        raise SystemExit(f"{name}: not judged, nothing recorded: {skipped[0]}")
    rec = {"loader": v["loader"]["spec"], "command": "pytest --workerstart " + " ".join(args),
           "machine": v["machine"], "usable_cores": v["machine"]["usable_cpus"],
           "outcomes": {c["id"]: c["outcome"] for c in speed},
           "measurements": {c["id"]: c["measurements"] for c in speed}}
    (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        name, _, spec = arg.partition("=")
        print(name, record(name, spec)["outcomes"])
