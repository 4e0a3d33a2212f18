"""Render committed verdict JSONs as the markdown table in docs/results.md.

    python -m pytest_workerstart.results_table docs/results/*.json > docs/results/table.md
    python -m pytest_workerstart.results_table --write docs/results   # every published table

One row per check id and one column per loader x context (the contexts any of
the verdicts ran); every failure and skip in the verdicts is listed below the
table with its reason and, for a verdict recorded with ``--workerstart-baseline``,
whether the baseline (stock torch) got the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_workerstart.verdict import cell

CONTEXTS = ("spawn", "forkserver", "fork")
#: the published verdicts (docs/results/NAME.json, re-recorded by `make results`), by the table they make
PUBLISHED = {
    "table.md": ("reference", "torch", "torchdata"),
    "third-party.md": ("monai-dataloader", "monai-threaddataloader", "litdata", "mosaic-streaming",
                       "accelerate-dataloadershard", "accelerate-dataloaderdispatcher", "webdataset-webloader"),
}


def published(folder: Path, table: str) -> list[Path]:
    """The verdict files of ``table`` that ``folder`` holds, in the table's order."""
    return [p for p in (folder / f"{name}.json" for name in PUBLISHED[table]) if p.exists()]


def render(paths: list[Path]) -> str:
    return render_verdicts([json.loads(Path(p).read_text()) for p in paths])


def render_verdicts(verdicts: list[dict]) -> str:
    """The table and the list of failures and skips of verdicts already read."""
    ids = sorted({c["id"] for v in verdicts for c in v["checks"]})
    contexts = [ctx for ctx in CONTEXTS if any(ctx in v["settings"]["contexts_run"] for v in verdicts)]
    head = ["check"]
    for v in verdicts:
        for ctx in contexts:
            head.append(f"{v['loader']['spec']} {ctx}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for check_id in ids:
        row = [f"`{check_id}`"]
        for v in verdicts:
            for ctx in contexts:
                row.append(cell([c["outcome"] or "not run" for c in v["checks"]
                                 if c["id"] == check_id and c["context"] == ctx], empty="–"))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for v in verdicts:
        lo = v["loader"]
        s = v["summary"]
        own = lo["qualified_name"].split(".")[0] == lo.get("package")
        label = (f"{lo['qualified_name']} {lo['version']}" if own
                 else f"{lo['qualified_name']}, {lo['package']} {lo['version']}")
        lines.append(f"**{lo['spec']}** ({label}; Python {v['machine']['python']}, "
                     f"torch {v['machine']['torch']}, {v['machine']['cpu_count']} CPUs): "
                     + ", ".join(f"{s[k]} {k}" for k in ("passed", "failed", "skipped", "xfailed", "error")))
        lines.append("")
        notes = [c for c in v["checks"] if c["outcome"] in ("failed", "error", "skipped", "xfailed")]
        for c in sorted(notes, key=lambda c: (c["id"], c["nodeid"])):
            reason = " ".join(c["reason"].split())[:300].replace("|", "\\|")
            lines.append(f"- `{c['nodeid'].split('::')[-1]}` {c['outcome']}{_against_baseline(v, c)}: {reason}")
        lines.append("")
    return "\n".join(lines)


def _against_baseline(verdict: dict, check: dict) -> str:
    if not verdict.get("baseline"):
        return ""
    name = verdict["baseline"]["loader"].get("spec", "baseline")
    base = check.get("baseline_outcome")
    if base is None:
        return f" (not in the {name} baseline)"
    return f" (same as {name})" if base == check["outcome"] else f" ({name}: {base})"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        for table in PUBLISHED:
            (Path(sys.argv[2]) / table).write_text(render(published(Path(sys.argv[2]), table)))
    else:
        sys.stdout.write(render([Path(p) for p in sys.argv[1:]]))
