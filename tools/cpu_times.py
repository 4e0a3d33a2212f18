"""Where the self-tests' CPU goes: a pytest plugin, and a summary of what it wrote.

    python -m pytest -p tools.cpu_times --cpu-times=cpu.jsonl -n 4 --dist loadscope -m "not speed" tests
    python -m tools.cpu_times cpu.jsonl

One JSON line per test (xdist workers append to the same file): wall seconds, the CPU of the
process that ran it, the CPU of the children it waited for (a suite it started, with the workers
that suite reaped; not a forkserver's workers until that forkserver is reaped), and the machine's
busy and total CPU seconds at the test's start and end. The summary gives the run's CPU use over
time (how busy the machine was between test boundaries), the tests and modules by CPU, and the
tests that mostly waited.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

import psutil
import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="PATH", help="append one JSON line per test: wall and CPU seconds")


def _machine() -> tuple[float, float]:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0), sum(t)


def _own() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-times")
    if not path:
        return (yield)
    t0, (s0, c0), m0 = time.time(), _own(), _machine()
    try:
        return (yield)
    finally:
        (s1, c1), m1 = _own(), _machine()
        line = {"id": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "start": t0,
                "wall": time.time() - t0, "cpu": s1 - s0, "children": c1 - c0,
                "machine_start": m0, "machine_end": m1}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def summary(rows: list[dict], top: int = 25) -> str:
    rows = sorted(rows, key=lambda r: r["start"])
    begin, end = rows[0]["start"], max(r["start"] + r["wall"] for r in rows)
    samples = sorted([(r["start"], *r["machine_start"]) for r in rows]
                     + [(r["start"] + r["wall"], *r["machine_end"]) for r in rows])
    out = [f"{len(rows)} tests, {end - begin:.0f} s wall, {psutil.cpu_count()} CPUs here",
           "machine busy (share of all CPUs) per minute:"]
    per_min: dict[int, list] = defaultdict(lambda: [0.0, 0.0])
    for (t0, b0, a0), (_, b1, a1) in zip(samples, samples[1:], strict=False):
        m = per_min[int((t0 - begin) // 60)]
        m[0] += b1 - b0
        m[1] += a1 - a0
    out += [f"  min {k:3d}: {100 * b / a:5.1f}%" for k, (b, a) in sorted(per_min.items()) if a > 0]
    for r in rows:
        r["total"] = r["cpu"] + r["children"]
    total, own = sum(r["total"] for r in rows), sum(r["cpu"] for r in rows)
    out.append(f"CPU seen by the tests: {total:.0f} s (own {own:.0f} s)")
    out.append(f"top {top} tests by CPU (wall, CPU, share of wall on CPU):")
    out += [f"  {r['total']:7.1f} s CPU {r['wall']:7.1f} s wall {100 * r['total'] / max(r['wall'], 1e-9):5.0f}%  "
            f"{r['id']}" for r in sorted(rows, key=lambda r: -r["total"])[:top]]
    mods: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = mods[r["id"].split("::")[0]]
        m[0] += r["total"]
        m[1] += r["wall"]
        m[2] += 1
    out.append("modules by CPU (CPU, wall, tests):")
    out += [f"  {c:7.1f} s {w:7.1f} s {n:4d}  {name}"
            for name, (c, w, n) in sorted(mods.items(), key=lambda x: -x[1][0])]
    waiting = [r for r in rows if r["wall"] > 20 and r["total"] < 0.25 * r["wall"]]
    out.append("tests over 20 s that were on CPU under a quarter of their wall time:")
    out += [f"  {r['wall']:7.1f} s wall {r['total']:6.1f} s CPU  {r['id']}"
            for r in sorted(waiting, key=lambda r: -r["wall"])]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.cpu_times FILE.jsonl", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        print(summary([json.loads(line) for line in f if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
