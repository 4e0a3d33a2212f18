"""Which processes a command's CPU goes to: its process tree sampled, summed by kind.

    python -m tools.proc_census census.json -- python -m pytest -n 4 --dist loadscope -m "not speed" tests
    python -m tools.proc_census census.json          # the summary of a census already taken

Every ``INTERVAL`` seconds each descendant of the command is read (psutil): its command line
once, its CPU seconds each time; the last reading is its CPU. A process that lives less than
one interval is missed (its CPU is mostly in its parent's children's time, which this does
not count). The summary sums the processes by kind (:data:`KINDS`, first match; a fork child
with its parent's command line is its own kind), with how many there were and the CPU of each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import defaultdict

import psutil

INTERVAL = 0.2
#: (kind, pattern on the command line): what the self-tests start, in the order it is tried
KINDS = (
    ("xdist worker", r"-c import sys;exec\(eval\(sys\.stdin\.readline\(\)\)\)"),
    ("scenario zygote", r"pytest_workerstart\.harness\.runner --zygote"),
    ("scenario runner", r"pytest_workerstart\.harness\.runner"),
    ("stdlib forkserver", r"from multiprocessing\.forkserver import main"),
    ("private forkserver", r"import signal; signal\.signal\(signal\.SIGINT, signal\.SIG_IGN\); import sys; sys\.path"),
    ("spawn child", r"from multiprocessing\.spawn import spawn_main"),
    ("resource tracker", r"from multiprocessing\.resource_tracker import main"),
    ("boot probe", r"-c import torch\.utils\.data$"),
    ("pytester subprocess", r"-mpytest --basetemp="),
    ("pytest run", r"-m ?pytest\b|/pytest\b"),
)


def kind_of(cmdline: str, parent_cmdline: str | None) -> str:
    kind = next((k for k, pattern in KINDS if re.search(pattern, cmdline)), "other")
    return f"{kind} (fork child)" if parent_cmdline == cmdline else kind


def sample(cmd: list[str]) -> tuple[int, list[dict]]:
    """Run ``cmd``; its exit code and one record per descendant seen."""
    proc = subprocess.Popen(cmd)
    root = psutil.Process(proc.pid)
    seen: dict[tuple[int, float], dict] = {}
    while proc.poll() is None:
        try:
            tree = root.children(recursive=True)
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    rec = seen.get(key)
                    if rec is None:
                        rec = seen[key] = {"pid": p.pid, "ppid": p.ppid(), "start": key[1],
                                           "cmdline": " ".join(p.cmdline())}
                    t = p.cpu_times()
                    rec["cpu"] = t.user + t.system
            except psutil.Error:
                continue
        time.sleep(INTERVAL)
    return proc.returncode, list(seen.values())


def summary(records: list[dict]) -> str:
    by_pid: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        by_pid[r["pid"]].append(r)

    def parent_cmdline(r: dict) -> str | None:  # the parent: the latest process with that pid started before
        older = [p for p in by_pid.get(r["ppid"], ()) if p["start"] <= r["start"]]
        return max(older, key=lambda p: p["start"])["cmdline"] if older else None

    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in records:
        k = kind_of(r["cmdline"], parent_cmdline(r))
        cpu[k] += r.get("cpu", 0.0)
        count[k] += 1
    total = sum(cpu.values())
    out = [f"{len(records)} processes, {total:.0f} s of CPU (kind: CPU, processes, CPU each)"]
    out += [f"  {cpu[k]:8.1f} s {count[k]:6d} {cpu[k] / count[k]:6.2f} s  {k}"
            for k in sorted(cpu, key=lambda k: -cpu[k])]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv or (len(argv) > 1 and argv[1] != "--") or argv[0] == "--":
        print("usage: python -m tools.proc_census OUT.json [-- CMD ...]", file=sys.stderr)
        return 2
    rc = 0
    if len(argv) > 2:
        rc, records = sample(argv[2:])
        with open(argv[0], "w") as f:
            json.dump(records, f)
    else:
        with open(argv[0]) as f:
            records = json.load(f)
    print(summary(records))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
