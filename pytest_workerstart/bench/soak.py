"""The loaders' soak: ``python -m pytest_workerstart.bench soak``.

Many iterator lifecycles in one driver process (create, read a few batches, ``break`` or
exhaust, drop), alternating persistent workers and not and parallelism 1 and 4, then many
epochs of one persistent loader. Every ``--every`` cycles the driver's resources are
sampled: open fds, threads, live children, zombie children, the named semaphores it holds registered
with the resource tracker, ``/dev/shm`` entries its process tree created
that still exist (attributed by :class:`~pytest_workerstart.probes.shm.ShmWatch`), and the driver's
PSS. A resource is **flat** when its last sample is within an allowance of its sample after
the warm-up (the first ``--every`` cycles open what is opened once: a forkserver, torch's
caches): 0 for children, zombies and ``/dev/shm`` entries, 2 fds, 1 thread, and for PSS
the larger of 16 MiB and 5 %. A sample over an allowance is taken again, every half second for
up to ``SETTLE_S``, and each resource's lowest value counts (the row's ``settle_s`` says how long
it took): what a loader releases late (a worker still exiting on a loaded machine, a transient
fd of the watch's own thread) is not a leak, what it never releases still is. The slope of a
least-squares line over the samples after the warm-up is reported beside it (per 1,000 cycles)
but is not the judgement: PSS wanders with the allocator, and a leak of one fd per 50 cycles
shows in the difference. Each row also counts the driver's fds by kind, so a count that grows
says what grows.

    python -m pytest_workerstart.bench soak --loader reference torch --json soak.json
    python -m pytest_workerstart.bench soak-plot soak.json -o soak.png
    python -m pytest_workerstart.bench soak-table soak.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import sys
import time

import psutil

from pytest_workerstart import protocol
from pytest_workerstart.bench._optional import require
from pytest_workerstart.probes.leaks import fd_targets
from pytest_workerstart.probes.shm import ShmWatch

RESOURCES = ("fds", "threads", "children", "zombies", "shm_entries", "semaphores", "pss_mib")
#: what a flat resource may gain between the sample after the warm-up and the last one
ALLOWANCE = {"fds": 2, "threads": 1, "children": 0, "zombies": 0, "shm_entries": 0, "semaphores": 0}
PSS_ALLOWANCE_MIB, PSS_ALLOWANCE_FRACTION = 16.0, 0.05
SETTLE_S = 20.0


def allowance(resource: str, after_warmup: float) -> float:
    return (max(PSS_ALLOWANCE_MIB, PSS_ALLOWANCE_FRACTION * after_warmup) if resource == "pss_mib"
            else ALLOWANCE[resource])


def over(row: dict, after_warmup: dict) -> list[str]:
    """The resources of ``row`` beyond their allowance over the phase's sample after the warm-up."""
    return [r for r in RESOURCES if row[r] - after_warmup[r] > allowance(r, after_warmup[r])]


def settled(measure, after_warmup: dict | None, settle_s: float = SETTLE_S) -> dict:
    """``measure()``, taken again while a resource is over its allowance (at most ``settle_s``);
    each resource keeps its lowest value."""
    t0 = time.monotonic()
    row = measure()
    while after_warmup is not None and over(row, after_warmup) and time.monotonic() - t0 < settle_s:
        time.sleep(0.5)
        again = measure()
        row = again | {r: min(row[r], again[r]) for r in RESOURCES}
    return row | {"settle_s": round(time.monotonic() - t0, 1)}


class _Items:
    """Item i is ``tensor([i])`` (module level: workers unpickle it)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        return torch.tensor([i])


class _Registrations:
    """Net named semaphores this process registered with the resource tracker (registered,
    less unregistered): what its tracker would call leaked if the driver exited now."""

    def __init__(self):
        from multiprocessing import resource_tracker

        self.module, self.net = resource_tracker, 0
        self._register, self._unregister = resource_tracker.register, resource_tracker.unregister

    def register(self, name, rtype):
        self.net += rtype == "semaphore"
        return self._register(name, rtype)

    def unregister(self, name, rtype):
        self.net -= rtype == "semaphore"
        return self._unregister(name, rtype)

    def __enter__(self):
        self.module.register, self.module.unregister = self.register, self.unregister
        return self

    def __exit__(self, *exc):
        self.module.register, self.module.unregister = self._register, self._unregister


def sample(watch, registrations: _Registrations) -> dict[str, float]:
    """The driver's resources now; ``/dev/shm`` entries are those its tree created (``watch``)
    that still exist, so another job's never count."""
    me = psutil.Process()
    kids = me.children(recursive=True)
    zombies = 0
    for k in kids:
        try:
            zombies += k.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            continue
    shm = [n for n in watch.left() if not n.startswith("sem.")]
    return {"fds": me.num_fds(), "fd_kinds": fd_kinds(), "threads": me.num_threads(),
            "children": len(kids) - zombies, "zombies": zombies, "shm_entries": len(shm),
            "semaphores": registrations.net, "pss_mib": me.memory_full_info().pss / 2**20}


def fd_kinds() -> dict[str, int]:
    """This process's open fds by kind (``pipe``, ``socket``, ``anon_inode``, or the file's
    directory), so a count that grows says what grows."""
    kinds: dict[str, int] = {}
    for target in fd_targets().values():
        kind = target.partition(":")[0] if ":" in target else os.path.dirname(target) or target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _make(loader: str, context: str, num_workers: int, p: int, persistent: bool):
    """The loader built through the loader protocol, as every benchmark path builds it: ``p``
    through its declared parallelism keyword where it has one."""
    under_test = _resolved(loader)
    kw = dict(batch_size=2, num_workers=num_workers, multiprocessing_context=context,
              persistent_workers=persistent)
    return under_test.make(_Items(16), parallelism=p if under_test.parallelism_kwarg else None, **kw)


@functools.cache
def _resolved(loader: str) -> protocol.LoaderUnderTest:
    return protocol.resolve(loader)


def soak(loader: str, context: str, cycles: int, epochs: int, every: int, progress=None,
         settle_s: float = SETTLE_S) -> dict:
    """``cycles`` lifecycles, then ``epochs`` epochs of one persistent loader, sampled every ``every``."""
    import multiprocessing

    if loader == "torch" and context == "forkserver":
        # torch's workers then fork from a server that imported torch once, as the reference's do
        multiprocessing.set_forkserver_preload(["torch", "torch.utils.data", __name__])

    with ShmWatch() as watch, _Registrations() as registrations:
        # the watch's own thread is the soak's, not the loader's
        return _soak(loader, context, cycles, epochs, every, progress,
                     lambda: sample(watch, registrations) | {"threads": psutil.Process().num_threads() - 1},
                     settle_s)


def _soak(loader: str, context: str, cycles: int, epochs: int, every: int, progress, measure,
          settle_s: float = SETTLE_S) -> dict:
    series: list[dict] = []
    t0 = time.monotonic()

    def take(phase: str, cycle: int) -> None:
        first = next((r for r in series if r["phase"] == phase), None)
        series.append({"phase": phase, "cycle": cycle, "t": time.monotonic() - t0,
                       **settled(measure, first, settle_s)})

    for k in range(cycles):
        persistent, p = k % 2 == 1, (1, 4)[(k // 2) % 2]
        dl = _make(loader, context, 4, p, persistent)
        for i, batch in enumerate(dl):
            if k % 3 != 2 and i == 2:  # two of three lifecycles break early, one exhausts the epoch
                break
        del batch, dl
        gc.collect()
        if (k + 1) % every == 0:
            take("lifecycles", k + 1)
            if progress:
                progress(f"{loader} {context}: {k + 1}/{cycles} lifecycles")
    dl = _make(loader, context, 4, 4, True)
    for e in range(epochs):
        for batch in dl:
            pass
        del batch
        if (e + 1) % every == 0:
            gc.collect()
            take("epochs", e + 1)
    del dl
    gc.collect()
    return {"loader": loader, "context": context, "cycles": cycles, "epochs": epochs, "every": every,
            "series": series, "judgement": judge(series)}


def _slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def judge(series: list[dict]) -> dict[str, dict]:
    """Per phase and resource: the sample after the warm-up, the last, the allowance, flat or not."""
    out: dict[str, dict] = {}
    for phase in ("lifecycles", "epochs"):
        rows = [r for r in series if r["phase"] == phase]
        if len(rows) < 2:
            continue
        first, last = rows[0], rows[-1]
        for res in RESOURCES:
            limit = allowance(res, first[res])
            slope = _slope([r["cycle"] for r in rows], [r[res] for r in rows])
            out[f"{phase}/{res}"] = {"after_warmup": first[res], "last": last[res], "allowance": round(limit, 1),
                                     "slope_per_1000": None if slope is None else round(1000 * slope, 2),
                                     "flat": last[res] - first[res] <= limit}
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench soak",
                                description="Iterator lifecycles and epochs in one driver; resources sampled.")
    p.add_argument("--loader", nargs="+", default=["reference", "torch"], choices=("reference", "torch"))
    p.add_argument("--plan", nargs="+", default=["forkserver:1000", "spawn:50"], metavar="CONTEXT:CYCLES")
    p.add_argument("--epochs", type=int, default=100, help="epochs of one persistent loader after the lifecycles")
    p.add_argument("--every", type=int, default=50,
                   help="sample every this many cycles (and epochs); a plan of fewer than 5x this, every fifth of it")
    p.add_argument("--json", required=True)
    return p


def main(argv: list[str]) -> int:
    """Each (loader, context) soaks in a fresh interpreter: one's leftovers never count for another."""
    import subprocess

    a = parser().parse_args(argv)
    runs = []
    for loader in a.loader:
        for item in a.plan:
            context, _, cycles = item.partition(":")
            epochs = a.epochs if context == "forkserver" else 0
            # at least five samples of a short plan (50 spawn lifecycles), or there is no trend to judge
            every = min(a.every, max(1, int(cycles) // 5))
            code = (f"import json, sys; from pytest_workerstart.bench.soak import soak; "
                    f"json.dump(soak({loader!r}, {context!r}, {int(cycles)}, {epochs}, {every}, "
                    f"lambda m: print(m, file=sys.stderr, flush=True)), sys.stdout)")
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            sys.stderr.write(proc.stderr[-2000:])
            if proc.returncode != 0:
                runs.append({"loader": loader, "context": context, "error": proc.stderr[-2000:]})
                continue
            runs.append(json.loads(proc.stdout))
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
    return 0 if all("error" not in r for r in runs) else 1


def table(result: dict) -> str:
    lines = ["| loader | context | phase | resource | after warm-up | last | allowance | slope /1000 | flat |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        if "error" in run:
            lines.append(f"| {run['loader']} | {run['context']} | error | | | | | | |")
            continue
        for key, j in run["judgement"].items():
            phase, res = key.split("/")
            fmt = (lambda v: f"{v:.0f}") if res == "pss_mib" else (lambda v: f"{v:g}")
            lines.append(f"| {run['loader']} | {run['context']} | {phase} | {res} | {fmt(j['after_warmup'])} | "
                         f"{fmt(j['last'])} | {j['allowance']:g} | {j['slope_per_1000']} | "
                         f"{'yes' if j['flat'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, output: str) -> None:
    matplotlib = require("matplotlib", "plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if "error" not in r]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, res in zip(axes.flat, RESOURCES, strict=False):
        for run in runs:
            rows = [r for r in run["series"] if r["phase"] == "lifecycles"]
            ax.plot([r["cycle"] for r in rows], [r[res] for r in rows], marker=".",
                    label=f"{run['loader']} {run['context']} (every {run['every']})")
        ax.set_title(res)
        ax.set_xscale("log")  # 50 spawn lifecycles beside 1,000 forkserver ones
        ax.set_xlabel("lifecycles")
    axes.flat[-1].axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"soak: the driver's resources over iterator lifecycles "
                 f"({result['machine']['cpus']} CPUs, {result['date']})")
    fig.tight_layout()
    fig.savefig(output, dpi=90)
