"""The suite's own time to verdict: ``python -m pytest_workerstart.bench suite``.

Each (loader, profile) is one ``pytest --workerstart`` run in a fresh process and an
empty directory, as a user would start it; its wall and CPU time (the whole process
tree's) are measured from outside, and the verdict's per-case durations say where
the time went: per clause and context, per check id, and the rest (pytest's start,
collection, the zygote and the preflight) as what the run spent before and between
its checks.

    python -m pytest_workerstart.bench suite --loader reference torch --profile quick full --json suite.json
    python -m pytest_workerstart.bench suite-table suite.json > suite.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from pytest_workerstart.cores import usable_cores

#: what the time of a clause's checks is mostly made of (for the table's reader)
KIND = {"speed": "speed trials, each a fresh driver", "failure": "fault scenarios, each its own process tree",
        "exit": "a scenario process each (its interpreter's exit is judged)"}
IN_PROCESS = "in-process checks (worker boots, bounded waits)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench suite",
                                description="Time the conformance suite per loader and profile.")
    p.add_argument("--loader", nargs="+", default=["reference"], metavar="SPEC")
    p.add_argument("--profile", nargs="+", default=["quick"], choices=("quick", "full"))
    p.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                   help="passed to every run, e.g. --pytest-arg=--workerstart-context=fork")
    p.add_argument("--label", default="", help="a description of the machine")
    p.add_argument("--json", dest="json_out", required=True, metavar="OUT")
    p.add_argument("--verdicts", metavar="DIR", default=None,
                   help="also keep each run's verdict file as DIR/LOADER-PROFILE.json (e.g. to publish the "
                        "full-profile verdicts the timed runs gave)")
    return p


def _children_cpu() -> float:
    """CPU seconds of every descendant reaped so far (an orphan that init reaped is not in it)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(loader: str, profile: str, extra: list[str], progress, keep: Path | None = None) -> dict:
    """One suite run; its timings, outcome counts and per-case durations (``keep``: a directory
    that gets the run's verdict file)."""
    with tempfile.TemporaryDirectory(prefix="workerstart-bench-suite-") as d:
        verdict_path = Path(d) / "verdict.json"
        shown = ["pytest", "-p", "no:cacheprovider", "-q", "--workerstart", f"--workerstart-loader={loader}",
                 f"--workerstart-profile={profile}", *extra]
        cmd = [sys.executable, "-m", *shown, f"--workerstart-json={verdict_path}"]
        progress(f"{loader} {profile}: {' '.join(shown)}")
        cpu0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if not verdict_path.exists():
            raise RuntimeError(f"{loader} {profile}: no verdict (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        verdict = json.loads(verdict_path.read_text())
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"{Path(loader).name.replace(':', '-')}-{profile}.json").write_bytes(verdict_path.read_bytes())
    cases = [{"id": c["id"], "context": c.get("context"), "outcome": c["outcome"],
              "duration_s": c.get("duration_s") or 0.0} for c in verdict["checks"]]
    progress(f"{loader} {profile}: {wall:.0f} s wall, {cpu:.0f} s CPU, exit {proc.returncode}")
    about = verdict["loader"]
    return {"loader": loader, "loader_name": f"{loader} ({about.get('qualified_name')} {about.get('version')})",
            "profile": profile,
            "contexts": sorted({c["context"] for c in cases if c["context"]}), "command": " ".join(shown),
            "exitstatus": proc.returncode, "complete": verdict.get("complete"), "wall_s": wall,
            "cpu_s": cpu, "checks_s": sum(c["duration_s"] for c in cases), "cases": cases}


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    def progress(msg: str) -> None:
        print(f"[bench suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    keep = Path(args.verdicts) if args.verdicts else None
    runs = [run_one(loader, profile, args.pytest_arg, progress, keep)
            for loader in args.loader for profile in args.profile]
    out = {"label": args.label, "machine": {"cores": usable_cores(), "python": platform.python_version(),
                                            "when": time.strftime("%Y-%m-%d %H:%M")}, "runs": runs}
    Path(args.json_out).write_text(json.dumps(out, indent=1))
    sys.stdout.write(table(out))
    return 0


def _by(cases, key) -> dict:
    out: dict = defaultdict(float)
    for c in cases:
        out[key(c)] += c["duration_s"]
    return out


def table(result: dict) -> str:
    """Markdown: one row per run, then where each run's time went."""
    m = result["machine"]
    lines = [f"Machine: {result.get('label') or 'unlabelled'}, {m['cores']} usable cores, Python {m['python']}, "
             f"{m['when']}.", ""]
    if result.get("note"):  # what a reader must know to compare the rows (runs of different times)
        lines += [f"Note: {result['note']}", ""]
    lines += ["| loader | profile | contexts | wall s | CPU s (reaped tree) | in checks s | "
              "before and between checks s | passed / failed / skipped |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        n = _by([{**c, "duration_s": 1} for c in r["cases"]], lambda c: c["outcome"])
        between = r["wall_s"] - r["checks_s"]
        lines.append(f"| {r['loader_name'] or r['loader']} | {r['profile']} | {', '.join(r['contexts'])} | "
                     f"{r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['checks_s']:.0f} | {between:.0f} | "
                     f"{n.get('passed', 0):.0f} / {n.get('failed', 0):.0f} / {n.get('skipped', 0):.0f} |")
    for r in result["runs"]:
        lines += ["", f"### {r['loader_name'] or r['loader']}, {r['profile']} profile", "",
                  f"`{r['command']}`", "", "| clause | kind | " + " | ".join(r["contexts"]) + " | total s |",
                  "|---|---|" + "---|" * len(r["contexts"]) + "---|"]
        per = _by(r["cases"], lambda c: (c["id"].split(".", 1)[0], c["context"]))
        clauses = sorted({k[0] for k in per}, key=lambda cl: (-sum(v for k, v in per.items() if k[0] == cl), cl))
        for cl in clauses:
            cells = [f"{per.get((cl, ctx), 0.0):.0f}" for ctx in r["contexts"]]
            total = sum(v for k, v in per.items() if k[0] == cl)
            lines.append(f"| {cl} | {KIND.get(cl, IN_PROCESS)} | " + " | ".join(cells) + f" | {total:.0f} |")
        top = sorted(_by(r["cases"], lambda c: c["id"]).items(), key=lambda kv: -kv[1])[:8]
        lines += ["", "Slowest ids: " + ", ".join(f"`{i}` {s:.0f} s" for i, s in top) + "."]
    return "\n".join(lines) + "\n"


def render(results: list[dict]) -> str:
    return "".join(table(r) for r in results)
