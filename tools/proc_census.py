"""Which processes a command's CPU goes to: its process tree sampled, summed by kind and by self-test.

    python -m tools.proc_census census.json -- python -m pytest -n 4 --dist loadscope -m "not speed" tests
    python -m tools.proc_census census.json          # the summary of a census already taken

Every ``INTERVAL`` seconds each descendant of the command is read (psutil): its command line
once, its CPU seconds each time; the last reading is its CPU. A process that lives less than
one interval is missed (its CPU is mostly in its parent's children's time, which this does
not count). The summary sums the processes by kind (:data:`KINDS`, first match; a fork child
with its parent's command line is its own kind), with how many there were and the CPU of
each; then by the self-test whose temp directory (``tmp_path``, pytester's, a batch's) each
process ran in, from its working directory.
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
    ("warm pytest server", r"tests/_warm_server\.py"),
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
                                           "cmdline": " ".join(p.cmdline()), "cwd": _cwd(p)}
                    t = p.cpu_times()
                    rec["cpu"] = t.user + t.system
            except psutil.Error:
                continue
        time.sleep(INTERVAL)
    return proc.returncode, list(seen.values())


def _cwd(p: psutil.Process) -> str:
    try:
        return p.cwd()
    except psutil.Error:
        return ""


#: a self-test's own directory in pytest's temp tree (tmp_path, pytester's, a batch's): what it starts runs there
TEST_DIR = re.compile(r"/pytest-\d+/(?:popen-gw\d+/)?([^/]+)")


def test_of(cwd: str) -> str:
    """The self-test (its temp directory's name) a process ran for, from its working directory."""
    m = TEST_DIR.search(cwd or "")
    return m.group(1) if m else "(not in a test's directory)"


def by_test(records: list[dict], top: int = 40) -> str:
    """CPU summed by the self-test whose temp directory each process ran in (``top`` largest)."""
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in records:
        k = test_of(r.get("cwd", ""))
        cpu[k] += r.get("cpu", 0.0)
        count[k] += 1
    out = ["by the self-test's directory a process ran in (CPU, processes):"]
    out += [f"  {cpu[k]:8.1f} s {count[k]:6d}  {k}" for k in sorted(cpu, key=lambda k: -cpu[k])[:top]]
    return "\n".join(out)


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
    if any("cwd" in r for r in records):
        print(by_test(records))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
