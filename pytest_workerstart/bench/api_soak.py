"""The suite's own soak: ``python -m pytest_workerstart.bench api-soak``.

``check_loader`` called many times in one interpreter, as a notebook or a script that judges
loaders in a loop does: every verdict must give each case the same outcome as the first, and
the calling process must end with the fds, threads and children it had before the first call
(each run is a pytest subprocess; what it leaves in its caller is what this measures).

    python -m pytest_workerstart.bench api-soak --runs 20 --json docs/bench/api-soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import psutil

from pytest_workerstart.api import check_loader


def _resources() -> dict[str, int]:
    me = psutil.Process()
    return {"fds": me.num_fds(), "threads": me.num_threads(), "children": len(me.children(recursive=True))}


def soak(loader: str, runs: int, context: str, profile: str, checks=None, progress=None) -> dict:
    before = _resources()
    first: dict[str, str] | None = None
    rows = []
    for k in range(runs):
        t = time.monotonic()
        verdict = check_loader(loader, contexts=[context], profile=profile, checks=checks)
        outcomes = {c.nodeid: c.outcome for c in verdict.cases}
        first = outcomes if first is None else first
        rows.append({"run": k + 1, "s": round(time.monotonic() - t, 1), "exit": verdict.returncode,
                     "complete": verdict.complete, "summary": verdict.summary,
                     "differs": sorted(n for n in first.keys() | outcomes.keys() if first.get(n) != outcomes.get(n)),
                     **_resources()})
        if progress:
            progress(f"run {k + 1}/{runs}: {verdict!r} in {rows[-1]['s']} s")
    after = _resources()
    return {"loader": loader, "context": context, "profile": profile, "runs": rows, "before": before,
            "after": after, "identical": all(not r["differs"] and r["complete"] for r in rows),
            "flat": after == before}


def table(result: dict) -> str:
    lines = [f"check_loader({result['loader']!r}, contexts=[{result['context']!r}], profile={result['profile']!r}), "
             f"{len(result['runs'])} calls in one interpreter ({result['machine']['cpus']} CPUs, {result['date']})",
             "", "| run | s | exit | passed | failed | skipped | cases unlike run 1 | fds | threads | children |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    b = result["before"]
    lines.append(f"| before | | | | | | | {b['fds']} | {b['threads']} | {b['children']} |")
    for r in result["runs"]:
        s = r["summary"]
        lines.append(f"| {r['run']} | {r['s']:g} | {r['exit']} | {s['passed']} | {s['failed']} | {s['skipped']} | "
                     f"{len(r['differs'])} | {r['fds']} | {r['threads']} | {r['children']} |")
    lines += ["", f"Every verdict like the first: **{'yes' if result['identical'] else 'no'}**; "
                  f"the caller ends with what it had: **{'yes' if result['flat'] else 'no'}** "
                  f"({result['before']} before, {result['after']} after)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench api-soak",
                                description="check_loader many times in one interpreter: same verdicts, "
                                            "nothing left in the caller.")
    p.add_argument("--loader", default="reference")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--context", default="forkserver")
    p.add_argument("--profile", default="quick", choices=("quick", "full"))
    p.add_argument("--check", nargs="+", default=None, help="check ids (default: every one)")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    result = soak(a.loader, a.runs, a.context, a.profile, a.check, lambda m: print(m, file=sys.stderr, flush=True))
    result |= {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "date": time.strftime("%Y-%m-%d %H:%M")}
    with open(a.json, "w") as f:
        json.dump(result, f, indent=2)
    sys.stdout.write(table(result))
    return 0 if result["identical"] and result["flat"] else 1
