"""The explorer's power: over many seeds, how often does exploration at the default budget find
a broken loader whose defect lives in one region of a check's space?

One suite run per seed judges every loader given (each in its own embedded module, as a
project would embed the checks), only the explored case of the check each one targets, in one
context. A loader is found in a run when its explored case failed. Corners are not run: this
measures the explorer alone (docs/contract.md#configuration-space). ``--profile quick`` runs
the quick profile's corners instead (no seed enters them: one run says what every run finds).

    python -m pytest_workerstart.bench explore-power --seeds 20 --context fork --json power.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_workerstart import space
from pytest_workerstart.conformance import by_check_id
from pytest_workerstart.fixtures.broken import catalog
from pytest_workerstart.settings import DEFAULT_EXPLORE_S


def _regional() -> list[str]:
    """Every broken loader whose defect lives in one region of its check's space."""
    return [name for name, c in catalog.load()[0].items() if c.region is not None]


def _source(spec: str, check_id: str) -> str:
    assert space.get(check_id) is not None, check_id
    funcs = [(fn.__module__, name) for name, fn in by_check_id().get(check_id, [])
             if "ws_point" in fn.__code__.co_varnames[:fn.__code__.co_argcount]]
    lines = ["import pytest", ""] + [f"from {mod} import {name}  # noqa: F401" for mod, name in funcs]
    return "\n".join([*lines, "", "", "@pytest.fixture(scope='module')", "def workerstart_loader():",
                      f"    return {spec!r}", ""])


def run(loaders: list[str], seeds: list[int], context: str, budget: float | None, profile: str = "full") -> dict:
    catches, _ = catalog.load()
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="ws-power-") as d:
            for name in loaders:
                (Path(d) / f"test_power_{name}.py").write_text(_source(catches[name].spec, catches[name].targets[0]))
            out = Path(d) / "verdict.json"
            cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--workerstart-context={context}",
                   f"--workerstart-profile={profile}", "--workerstart-preflight=false",
                   f"--workerstart-explore-seed={seed}", "--workerstart-circuit-breaker=0",
                   "-k", "explore" if profile == "full" else "_at or respects_bound", f"--workerstart-json={out}"]
            if budget is not None:
                cmd.append(f"--workerstart-explore={budget:g}")
            t0 = time.monotonic()
            subprocess.run(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
            wall = time.monotonic() - t0
            checks = json.loads(out.read_text())["checks"] if out.exists() else []
        for name in loaders:
            cases = [c for c in checks if f"test_power_{name}.py::" in c["nodeid"]]
            case = next((c for c in cases if c["outcome"] == "failed"), cases[0] if cases else None)
            found = bool(case and case["outcome"] == "failed")
            ex = ((case or {}).get("measurements") or {}).get("exploration") or {}
            drawn_to_find = None
            if case and case["outcome"] == "failed" and ex:
                judged = case["measurements"]["points"]
                drawn = [p for p in judged if p["origin"] == "drawn"]
                drawn_to_find = next((k + 1 for k, p in enumerate(drawn) if p["outcome"] == "failed"), None)
            rows.append({"loader": name, "seed": seed, "outcome": case["outcome"] if case else None,
                         "found": found, "drawn": ex.get("drawn"),
                         "drawn_to_find": drawn_to_find, "failing_point": ex.get("failing_point")
                         or (case["measurements"]["points"][0]["point"] if found and not ex else None),
                         "case_s": case["duration_s"] if case else None, "run_wall_s": round(wall, 1)})
        print(f"seed {seed}: " + ", ".join(f"{r['loader']} {'found' if r['found'] else r['outcome']}"
                                           for r in rows[-len(loaders):]), file=sys.stderr, flush=True)
    return {"context": context, "profile": profile, "budget_s": budget, "seeds": seeds, "rows": rows}


def table(result: dict) -> str:
    budget = result["budget_s"] if result["budget_s"] is not None else DEFAULT_EXPLORE_S
    if result.get("profile", "full") == "full":
        head = f"Explorer power under {result['context']}, {budget:g} s budget, seeds " \
               f"{min(result['seeds'])}..{max(result['seeds'])}:"
    else:
        head = f"The {result['profile']} profile's corners under {result['context']} (no seed enters them):"
    lines = [head, "",
             "| loader | found | points drawn until found (median, max) | shrunk to (most often) |",
             "|---|---|---|---|"]
    by: dict[str, list[dict]] = {}
    for r in result["rows"]:
        by.setdefault(r["loader"], []).append(r)
    for name, rows in by.items():
        found = [r for r in rows if r["found"]]
        k = sorted(r["drawn_to_find"] for r in found if r["drawn_to_find"])
        med = f"{k[len(k) // 2]}, {k[-1]}" if k else "-"
        points = [r["failing_point"] for r in found if r["failing_point"]]
        common = max(set(points), key=points.count) if points else "-"
        lines.append(f"| `{name}` | {len(found)}/{len(rows)} | {med} | `{common}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench explore-power")
    p.add_argument("--loader", nargs="+", default=None, help="broken loaders of the catalog (default: every "
                   "region-confined one)")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--context", default="fork", choices=("fork", "forkserver", "spawn"))
    p.add_argument("--budget", type=float, default=None, help="seconds (default: the full profile's)")
    p.add_argument("--profile", default="full", choices=("full", "quick"),
                   help="full: the explored cases alone; quick: the quick profile's corners")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    seeds = list(range(a.first_seed, a.first_seed + (a.seeds if a.profile == "full" else 1)))
    result = run(a.loader or _regional(), seeds, a.context, a.budget, a.profile)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(table(result))
    return 0
