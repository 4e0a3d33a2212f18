"""``sharding.exactly_once`` over ranks of a real ``torch.distributed`` group.

Runs in fresh interpreters (the ranks); imports only what the rooms' rule allows
(:mod:`pytest_workerstart.conformance`).

The suite runs it on 2 gloo ranks on 127.0.0.1 (:func:`scenario_distributed`,
through the scenario runner, judged by :func:`judge_distributed`).
The same check runs on a real multi-node group under ``torchrun``::

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m pytest_workerstart.distributed --loader reference --context spawn --num-workers 4

Every rank builds the loader under test (parallel start where declared),
iterates a ``DistributedSampler`` map dataset and a rank x worker sharded
iterable, and meets the others in a barrier; rank 0 gathers every report and
judges that ranks x workers covered each index exactly once. Exit status 0
when it holds, 1 otherwise (printed on rank 0).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import threading
import time
from typing import Any

from pytest_workerstart import protocol
from pytest_workerstart.datasets import ShardedRange, WorkerTagDataset
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.faults import FaultPlan, describe_chain
from pytest_workerstart.probes.leaks import LeakSnapshot
from pytest_workerstart.scenarios import rebuild


def run_rank(rank: int, world_size: int, init_method: str, loader: dict, context: str, num_workers: int,
             parallelism: int | None, n: int, fail_rank: int | None, pg_timeout: float,
             destroy: bool = False) -> dict[str, Any]:
    """One rank's part; returns its report (never raises)."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    report: dict[str, Any] = {"rank": rank}
    try:
        under_test = rebuild(loader, context)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        before = LeakSnapshot.take()
        faults = FaultPlan.start_error(0) if rank == fail_rank else None
        ctx = InstrumentedContext(context, num_workers=num_workers, faults=faults)
        ds = WorkerTagDataset(n)
        sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        try:
            dl = under_test.make(ds, num_workers=num_workers, multiprocessing_context=ctx, parallelism=parallelism,
                          batch_size=2, sampler=sampler)
            report["map"] = [[int(i), int(w)] for b in dl for i, w in zip(b["index"], b["worker"], strict=False)]
            ctx.begin_generation()
            dl = under_test.make(ShardedRange(n, rank=rank, world_size=world_size), num_workers=num_workers,
                          multiprocessing_context=ctx, parallelism=parallelism, batch_size=None)
            report["iterable"] = [int(x) for x in dl]
        except Exception as exc:
            report["raised"] = describe_chain(exc)
            exc = None
        dl = None
        live = LeakSnapshot.wait_clean(before, timeout=10, kinds=("processes", "threads"))
        report["live_after"] = live.format() if live else ""
        if rank != fail_rank:  # a failed rank leaves without the barrier
            t1 = time.monotonic()
            try:
                dist.barrier()
                report["barrier"] = "ok"
            except Exception as exc:
                report["barrier"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            report["barrier_s"] = time.monotonic() - t1
        ctx.close()
        if destroy:
            dist.destroy_process_group()
    except Exception as exc:
        report["setup_error"] = describe_chain(exc)
    return report


def judge(reports: list[dict], world_size: int, num_workers: int, n: int, fail_rank: int | None,
          pg_timeout: float) -> list[str]:
    """Problems found in the ranks' reports (empty: the check holds)."""
    problems = [f"rank {r['rank']}: {r['setup_error']}" for r in reports if "setup_error" in r]
    if problems:
        return problems
    if fail_rank is None:
        for kind, index_of in (("map", lambda e: e[0]), ("iterable", lambda e: e)):
            counts = collections.Counter(index_of(e) for rep in reports for e in rep.get(kind, []))
            dup = {k: c for k, c in counts.items() if c > 1}
            lost = sorted(set(range(n)) - set(counts))
            if dup or lost:
                problems.append(
                    f"{kind} dataset over {world_size} ranks x {num_workers} workers: every index must appear once "
                    f"per epoch: duplication factor {sum(counts.values()) / n:.2f} ({len(dup)} duplicated, "
                    f"{len(lost)} missing)")
        for rep in reports:
            if rep.get("raised"):
                problems.append(f"rank {rep['rank']} raised: {rep['raised'][0]}")
        return problems
    bad = next(r for r in reports if r["rank"] == fail_rank)
    if not bad.get("raised"):
        problems.append(f"rank {fail_rank}: a worker start failed but the rank did not raise")
    if bad.get("live_after"):
        problems.append(f"rank {fail_rank} did not clean up after the failed start:\n{bad['live_after']}")
    for rep in reports:
        if rep["rank"] != fail_rank and rep.get("barrier_s", 0) > pg_timeout + 30:
            problems.append(f"rank {rep['rank']} waited {rep['barrier_s']:.0f} s for the failed rank "
                            f"(bound {pg_timeout + 30:.0f} s)")
    return problems


def scenario_distributed(loader: dict, context: str, world_size: int, num_workers: int, parallelism: int | None,
                         n: int, fail_rank: int | None, pg_timeout: float, outdir: str | None = None) -> dict[str, Any]:
    """``world_size`` ranks of a gloo group on 127.0.0.1 (torch.multiprocessing).

    Every rank iterates a map-style dataset through ``DistributedSampler`` and an
    IterableDataset sharded by rank x ``get_worker_info()``, then meets the others
    in a barrier. With ``fail_rank`` that rank's first worker start fails: it must
    raise and clean up; the others must not wait longer than ``pg_timeout``.
    Returns each rank's report and the processes left once all ranks have exited.
    ``outdir``: where ranks write their reports (default: a directory in this
    scenario's private temp directory, which the runner removes).
    """
    import json
    import socket
    import tempfile
    from pathlib import Path

    outdir = outdir or tempfile.mkdtemp(prefix="ranks-")
    import psutil
    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    pc = tmp.start_processes(_rank_main, args=(world_size, port, loader, context, num_workers, parallelism, n,
                                               fail_rank, pg_timeout, outdir),
                             nprocs=world_size, join=False, start_method=_rank_start_method())
    deadline = t0 + 4 * pg_timeout + 60
    ranks = pc.processes
    while any(p.is_alive() for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    hung = [r for r, p in enumerate(ranks) if p.is_alive()]
    for p in ranks:
        if p.is_alive():
            p.kill()
        p.join()
    elapsed = time.monotonic() - t0
    reports = {}
    for r in range(world_size):
        f = Path(outdir) / f"rank{r}.json"
        reports[r] = json.loads(f.read_text()) if f.exists() else None
    exitcodes = [p.exitcode for p in ranks]
    from multiprocessing import resource_tracker

    own_tracker = resource_tracker._resource_tracker._pid  # this interpreter's, if a spawn above started it
    left = []
    end = time.monotonic() + 15
    while time.monotonic() < end:
        left = [f"pid {c.pid} {' '.join(c.cmdline())[:120]}" for c in psutil.Process().children(recursive=True)
                if c.pid != own_tracker and c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.2)
    return {"reports": reports, "hung_ranks": hung, "exitcodes": exitcodes, "elapsed": elapsed, "left": left}


def _rank_start_method() -> str:
    """How the ranks start: not what the check judges (the workers' context is), so fork
    where it is safe (this interpreter runs no other thread, as when forked from the
    zygote): each spawned rank would import torch again."""
    return "fork" if threading.active_count() == 1 else "spawn"


def _rank_main(rank: int, world_size: int, port: int, loader: dict, context: str, num_workers: int,
               parallelism: int | None, n: int, fail_rank: int | None, pg_timeout: float, outdir: str) -> None:
    import json
    from pathlib import Path

    report = run_rank(rank, world_size, f"tcp://127.0.0.1:{port}", loader, context, num_workers,
                                  parallelism, n, fail_rank, pg_timeout)
    (Path(outdir) / f"rank{rank}.json").write_text(json.dumps(report))
    os._exit(1 if rank == fail_rank else 0)  # skip the group's atexit teardown, which can block on a dead peer


def judge_distributed(out: dict, world_size: int, num_workers: int, n: int, fail_rank: int | None,
                      pg_timeout: float) -> None:
    reps = out["reports"]
    missing = [r for r, rep in reps.items() if rep is None]
    assert not missing and not out["hung_ranks"], (
        f"ranks {missing or out['hung_ranks']} gave no report (hung: {out['hung_ranks']}, "
        f"exit codes {out['exitcodes']}, {out['elapsed']:.0f} s)")
    assert not out["left"], "processes left after every rank exited:\n" + "\n".join(out["left"])
    problems = judge(list(reps.values()), world_size, num_workers, n, fail_rank, pg_timeout)
    assert not problems, "\n".join(problems)


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun (reads RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment)."""
    p = argparse.ArgumentParser(prog="torchrun ... -m pytest_workerstart.distributed")
    p.add_argument("--loader", default="reference", help="SPEC, as for --workerstart-loader")
    p.add_argument("--context", default="spawn", choices=("spawn", "forkserver", "fork"))
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--parallelism", type=int, default=None, help="default: num-workers where declared")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--timeout", type=float, default=60.0, help="process-group timeout, seconds")
    args = p.parse_args(argv)
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    under_test = protocol.resolve(args.loader, None, None)
    parallelism = args.parallelism
    if parallelism is None and under_test.has("parallel_start", args.context):
        parallelism = args.num_workers
    report = run_rank(rank, world, "env://", under_test.payload(), args.context, args.num_workers, parallelism,
                      args.samples, None, args.timeout)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, report)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    problems = judge(gathered, world, args.num_workers, args.samples, None, args.timeout)
    verdict = "passed" if not problems else "failed"
    print(json.dumps({"check": "sharding.exactly_once", "ranks": world, "workers_per_rank": args.num_workers,
                      "loader": args.loader, "context": args.context, "verdict": verdict, "problems": problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
