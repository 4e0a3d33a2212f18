"""Render committed verdict JSONs as the markdown table in docs/results.md.

    python -m pytest_workerstart.results_table docs/results/*.json > docs/results/table.md

One row per check id and one column per loader x context; every failure and
skip in the verdicts is listed below the table with its reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_workerstart.verdict import cell

CONTEXTS = ("spawn", "forkserver", "fork")


def render(paths: list[Path]) -> str:
    verdicts = [json.loads(Path(p).read_text()) for p in paths]
    ids = sorted({c["id"] for v in verdicts for c in v["checks"]})
    head = ["check"]
    for v in verdicts:
        for ctx in CONTEXTS:
            head.append(f"{v['loader']['spec']} {ctx}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for check_id in ids:
        row = [f"`{check_id}`"]
        for v in verdicts:
            for ctx in CONTEXTS:
                row.append(cell([c["outcome"] or "not run" for c in v["checks"]
                                 if c["id"] == check_id and c["context"] == ctx], empty="–"))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for v in verdicts:
        lo = v["loader"]
        s = v["summary"]
        lines.append(f"**{lo['spec']}** ({lo['qualified_name']} {lo['version']}; Python {v['machine']['python']}, "
                     f"torch {v['machine']['torch']}, {v['machine']['cpu_count']} CPUs): "
                     + ", ".join(f"{s[k]} {k}" for k in ("passed", "failed", "skipped", "xfailed", "error")))
        lines.append("")
        notes = [c for c in v["checks"] if c["outcome"] in ("failed", "error", "skipped", "xfailed")]
        for c in sorted(notes, key=lambda c: (c["id"], c["nodeid"])):
            reason = " ".join(c["reason"].split())[:300].replace("|", "\\|")
            lines.append(f"- `{c['nodeid'].split('::')[-1]}` {c['outcome']}: {reason}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render([Path(p) for p in sys.argv[1:]]))
