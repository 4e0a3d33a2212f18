"""Startup timing: what one trial measures, and the statistics over trials.

One trial (:func:`trial`, run in a fresh interpreter by
:func:`pytest_workerstart.harness.trials.run_trials`) builds the loader and
measures constructor time, iterator creation, time to first batch, time until
every worker has delivered a batch, steady-state samples/s over batches 2..n,
and the process tree's memory: its PSS increase after the first and the last
batch (sampled outside the timed region), and its peak during the start, boots
included: the sum over every process of the tree of its own peak resident set
(:func:`tree_hwm`, read after the first batch, at batch 2N+1 and at the end).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from pytest_workerstart import protocol
from pytest_workerstart.probes.digest import batch_digest
from pytest_workerstart.probes.foreign_cpu import tree_cpu_s


def tree_pss() -> int:
    """PSS of this process and all its descendants, in bytes (Linux).

    A process that exits while it is read no longer counts; one whose memory
    cannot be read (permissions, no PSS on this kernel) is an error, never a
    silent zero."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except psutil.NoSuchProcess:  # exited (zombies included): nothing left to count
            continue
        except (psutil.AccessDenied, AttributeError) as exc:
            raise RuntimeError(f"cannot read the PSS of pid {p.pid} ({type(exc).__name__}): "
                               "the memory measurement would be incomplete") from exc
    return total


def tree_hwm() -> dict[int, int]:
    """Each process's peak resident set so far (the kernel's ``VmHWM``), in bytes,
    for this process and all its descendants: exact and cheap, unlike sampling
    PSS (a page-table walk per read, ~50 ms per 800 MB worker here, that the
    parallel side pays on a saturated CPU and that misses short peaks)."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                line = next((ln for ln in f if ln.startswith("VmHWM:")), None)
        except FileNotFoundError:  # exited meanwhile
            continue
        except OSError as exc:
            raise RuntimeError(f"cannot read the peak memory of pid {p.pid} ({exc}): "
                               "the memory measurement would be incomplete") from exc
        if line is not None:  # a zombie has no memory lines
            out[p.pid] = int(line.split()[1]) * 1024
    return out


class WorkerTagged:
    """``dataset``'s items with the pid of the process that computed them appended,
    so the driver sees which worker delivered each batch (the test's own truth,
    not the loader's)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return (*self.dataset[i], os.getpid())


def _untag(batch):
    return batch[:-1]


def _pids(batch) -> set[int]:
    return set(batch[-1].tolist())


def trial(loader: dict, dataset: str, dataset_kwargs: dict, loader_kwargs: dict, context: str,
          parallelism: int | None, max_batches: int, preload: Sequence[str] = (),
          generator_seed: int | None = None, tag_workers: bool = False, epochs: int = 1) -> dict[str, Any]:
    """One measurement; runs inside the fresh interpreter.

    Times are from the start of the loader's constructor (a loader that starts
    helpers there pays for them in every figure). ``arrival_s[k-1]``: when batch k
    arrived, for k = 1..``max_batches`` (the memory sampling pause after batch 1 left out).

    ``generator_seed`` gives the loader ``generator=torch.Generator().manual_seed(seed)``
    (shuffle order and worker seeds), so every trial sees the same first batch.
    ``tag_workers`` (a map-style dataset of tuples) wraps it in :class:`WorkerTagged`
    and measures ``time_to_all_workers_s``: from the start of the constructor until
    every one of ``num_workers`` pids has delivered a batch (``None`` if some never
    did within ``max_batches``). The first-batch digest leaves the tag out.
    ``epochs=2``: the first iterator is dropped after its batches and a second one
    drawn from the same loader: ``epoch2`` holds its figures, timed from its ``iter()``
    (``shutdown_s``: dropping the first iterator).
    """
    import importlib
    import multiprocessing

    under_test = protocol.from_payload(loader)
    if context == "forkserver" and preload:
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload))
        forkserver.ensure_running()  # the server's boot is not part of the loader's start
    mod, _, attr = dataset.partition(":")
    ds = getattr(importlib.import_module(mod), attr)(**dataset_kwargs)
    if tag_workers:
        ds = WorkerTagged(ds)
    want = int(loader_kwargs.get("num_workers", 0) or 0) or 1
    # "warm": batches after every worker has delivered twice (from batch 2N+1),
    # i.e. once workers that start after the first batch are all up.
    warm_from = 2 * int(loader_kwargs.get("num_workers", 0) or 0) + 1
    if generator_seed is not None:
        import torch

        loader_kwargs = {**loader_kwargs, "generator": torch.Generator().manual_seed(generator_seed)}
    gc.collect()
    pss0 = tree_pss()
    hwm0 = sum(tree_hwm().values())
    peaks: dict[int, int] = {}

    def note_peaks() -> None:
        for pid, hwm in tree_hwm().items():
            peaks[pid] = max(peaks.get(pid, 0), hwm)

    t0 = time.perf_counter()
    dl = under_test.make(ds, multiprocessing_context=context, parallelism=parallelism, **loader_kwargs)
    t1 = time.perf_counter()
    it = iter(dl)
    t2 = time.perf_counter()
    first = next(it)
    t3 = time.perf_counter()
    seen = _pids(first) if tag_workers else set()
    all_workers = t3 - t0 if len(seen) >= want else None
    if tag_workers:
        first = _untag(first)
    digest = batch_digest(first)
    size = _batch_len(first)
    del first
    pss1 = tree_pss()
    note_peaks()
    n = 0
    samples = 0
    arrivals = []  # (batch number, samples so far, time) for batches 2..max
    t4 = time.perf_counter()
    pause = t4 - t3  # memory sampling, left out of every later arrival time
    batch = None
    for batch in it:
        n += 1
        samples += _batch_len(batch)
        now = time.perf_counter()
        arrivals.append((n + 1, samples, now))
        if tag_workers and all_workers is None:
            seen |= _pids(batch)
            if len(seen) >= want:
                all_workers = now - t0 - pause
        if n + 1 == warm_from:
            note_peaks()  # a few /proc reads, before the throughput window begins
            cpu_warm = (samples, tree_cpu_s())
        if n + 1 >= max_batches:
            break
    t5 = time.perf_counter()
    cpu_end = tree_cpu_s()
    pss2 = tree_pss()
    note_peaks()
    second = None
    if epochs >= 2:
        t6 = time.perf_counter()
        del it, batch
        gc.collect()
        second = _second_epoch(dl, max_batches, time.perf_counter() - t6, tag_workers)
    else:
        del it
    del dl
    warm = [a for a in arrivals if a[0] >= warm_from]
    warm_rate = warm_cpu = None
    if len(warm) >= 3:
        warm_rate = (warm[-1][1] - warm[0][1]) / (warm[-1][2] - warm[0][2])
        # the whole tree's CPU per sample over the same window: what a machine pays
        # for the loader's steady state whatever else runs beside it
        warm_cpu = (cpu_end - cpu_warm[1]) / (samples - cpu_warm[0])
    return {
        "constructor_s": t1 - t0, "iterator_creation_s": t2 - t1, "time_to_first_batch_s": t3 - t0,
        "steady_batches": n, "steady_samples_per_s": samples / (t5 - t4) if t5 > t4 and samples else None,
        "warm_samples_per_s": warm_rate, "warm_cpu_s_per_sample": warm_cpu, "warm_from_batch": warm_from,
        # first batch to last, without the PSS sampling pause in between
        "time_to_last_batch_s": (t5 - t0) - pause,
        "arrival_s": [t3 - t0] + [a[2] - t0 - pause for a in arrivals],
        "time_to_all_workers_s": all_workers, "workers_delivered": len(seen) if tag_workers else None,
        "pss_increase_mb": (max(pss1, pss2) - pss0) / 2**20,
        "peak_rss_increase_mb": (sum(peaks.values()) - hwm0) / 2**20,
        "first_batch_digest": digest, "batch_size": size, "epoch2": second,
    }


def _second_epoch(dl, max_batches: int, shutdown_s: float, tag_workers: bool) -> dict[str, Any]:
    """A second iterator of ``dl`` (a new epoch), timed from its ``iter()``."""
    t1 = time.perf_counter()
    it2 = iter(dl)
    arrivals = []
    digest = None
    for batch in it2:
        arrivals.append(time.perf_counter() - t1)
        if digest is None:
            digest = batch_digest(_untag(batch) if tag_workers else batch)
        if len(arrivals) >= max_batches:
            break
    del it2
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return {"shutdown_s": shutdown_s, "time_to_first_batch_s": arrivals[0] if arrivals else None,
            "arrival_s": arrivals, "batches_per_s": (len(arrivals) - 1) / span if span > 0 else None,
            "first_batch_digest": digest}


def _batch_len(batch) -> int:
    if hasattr(batch, "shape"):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    return 1


def alternated(configs: Sequence[str], trials: int) -> list[str]:
    """AB, BA, AB, ... for two configurations; rotations for more."""
    order: list[str] = []
    for t in range(trials):
        seq = list(configs) if t % 2 == 0 else list(reversed(configs))
        order += seq
    return order


def summarize(values: Sequence[float]) -> dict[str, float]:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan"), "n": 0}
    q = statistics.quantiles(vals, n=10, method="inclusive") if len(vals) > 1 else [vals[0]] * 9
    return {"median": statistics.median(vals), "p10": q[0], "p90": q[-1], "n": len(vals)}


def paired_ratio(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> dict[str, float | None]:
    """numerator/denominator for two trial series measured side by side (trial j with trial j).

    ``ratio_of_medians`` is what checks and targets judge; ``median_pair_ratio``
    (each alternated pair's ratio, then the median) is reported beside it because
    it cancels drift that hits both members of a pair. ``None`` marks a failed
    trial: it leaves its median and its pair. A side with nothing left gives None.
    """
    num = [v for v in numerator if v is not None]
    den = [v for v in denominator if v is not None]
    pairs = [x / y for x, y in zip(numerator, denominator, strict=False) if x is not None and y]
    den_median = statistics.median(den) if den else 0
    return {"ratio_of_medians": statistics.median(num) / den_median if num and den_median else None,
            "median_pair_ratio": statistics.median(pairs) if pairs else None}


def derived_startup_threshold(one_worker_s: float, serial_s: float, num_workers: int, cores: int,
                              share: float = 0.5) -> dict[str, float]:
    """The speedup parallel start must reach, derived from this machine and workload.

    Serial start makes the first batch wait for N boots one after another:
    ``serial = F + N*B``; one worker alone gives ``one = F + B``. So the per-worker
    boot cost is ``B = (serial - one) / (N - 1)`` and the fixed part ``F = one - B``.
    N concurrent boots on C usable cores finish no sooner than ``F + B*N/min(N, C)``,
    so the ideal speedup is ``E = serial / (F + B*N/min(N, C))``. The threshold
    asks for ``share`` (one half) of the ideal gain: ``1 + share*(E - 1)``.
    On 2 cores with N=4 that is about 1.4x; on 88 cores with N=8 about 4x.
    """
    boot = max((serial_s - one_worker_s) / max(num_workers - 1, 1), 0.0)
    fixed = max(one_worker_s - boot, 0.0)
    ideal_parallel = fixed + boot * num_workers / max(min(num_workers, cores), 1)
    ideal = serial_s / ideal_parallel if ideal_parallel > 0 else 1.0
    return {"boot_s": boot, "fixed_s": fixed, "cores": cores, "ideal_speedup": ideal,
            "threshold": 1 + share * max(ideal - 1, 0.0)}
