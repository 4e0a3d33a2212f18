"""The startup benchmark: configurations, trials in fresh processes, the results JSON.

A configuration is (loader, context, workers, parallelism). Every trial runs in a
fresh interpreter (:func:`pytest_workerstart.probes.timing.trial`); trials of all
configurations are alternated pair by pair (AB, BA, ...), after the dataset has
been generated and verified. The JSON keeps every raw value, per-configuration
summaries (median, p10-p90) and, for each serial/parallel pair and for each
N-worker/1-worker pair, the ratio of medians and the median of per-pair ratios.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_workerstart import protocol
from pytest_workerstart.bench import eurosat
from pytest_workerstart.bench._optional import require
from pytest_workerstart.cores import usable_cores
from pytest_workerstart.harness.trials import run_trials
from pytest_workerstart.probes.timing import paired_ratio, summarize

DATASET = "pytest_workerstart.bench.eurosat:EuroSATLike"
METRICS = ("constructor_s", "iterator_creation_s", "time_to_first_batch_s", "steady_samples_per_s",
           "warm_samples_per_s", "time_to_last_batch_s", "pss_increase_mb")
#: ``forkserver+preload``: forkserver whose server imports torch, torchvision and
#: the dataset's module before the first worker (the server's own boot is not timed).
CONTEXTS = ("spawn", "forkserver", "forkserver+preload", "fork")
PRELOAD = ("torch", "torchvision", "pytest_workerstart.bench.eurosat")
#: what a second iterator (``--epochs 2``) reports, timed from its ``iter()``
EPOCH2_METRICS = ("shutdown_s", "time_to_first_batch_s", "batches_per_s")
SCHEMA = 2  # 2: arrival times of every batch, the second iterator (``epochs``), times from construction


@dataclasses.dataclass(frozen=True)
class Config:
    loader: str
    context: str
    num_workers: int
    parallelism: int  # 1 = the loader's default (serial) start

    @property
    def name(self) -> str:
        return f"{self.loader}/{self.context}/w{self.num_workers}/p{self.parallelism}"


def parse_parallelism(token: str, num_workers: int) -> int:
    """``1``, ``4``, ``N`` (= workers) or ``cores`` (= usable cores), capped at workers."""
    if token == "N":
        return num_workers
    if token == "cores":
        return min(usable_cores(), num_workers)
    value = int(token)
    if value < 1:
        raise ValueError(f"parallelism must be >= 1, got {token!r}")
    return min(value, num_workers)


def plan(loaders: Iterable[str], contexts: Iterable[str], workers: Iterable[int], parallelism: Iterable[str],
         parallel_contexts: dict[str, tuple[str, ...]]) -> list[Config]:
    """Every configuration, deduplicated; p > 1 only where the loader declares parallel start."""
    out: list[Config] = []
    for loader in loaders:
        for ctx in contexts:
            base_ctx = ctx.split("+")[0]
            for n in workers:
                for token in parallelism:
                    p = parse_parallelism(token, n)
                    if p > 1 and base_ctx not in parallel_contexts.get(loader, ()):
                        continue
                    cfg = Config(loader, ctx, n, p)
                    if cfg not in out:
                        out.append(cfg)
    return out


def parse_config(text: str, parallel_contexts: dict[str, tuple[str, ...]]) -> Config:
    """``LOADER/CONTEXT/wN/pP`` (P: an integer, ``N`` or ``cores``), e.g. ``torch/spawn/w8/p1``."""
    parts = text.rsplit("/", 3)
    if len(parts) != 4 or not parts[2].startswith("w") or not parts[3].startswith("p"):
        raise ValueError(f"configuration {text!r}: expected LOADER/CONTEXT/wN/pP, e.g. torch/spawn/w8/p1")
    loader, ctx, w, p = parts
    if ctx not in CONTEXTS:
        raise ValueError(f"configuration {text!r}: unknown context {ctx!r} (one of {', '.join(CONTEXTS)})")
    try:
        workers = int(w[1:])
        parallelism = parse_parallelism(p[1:], workers)
    except ValueError:
        raise ValueError(f"configuration {text!r}: workers and parallelism must be integers "
                         "(p may be N or cores)") from None
    if parallelism > 1 and ctx.split("+")[0] not in parallel_contexts.get(loader, ()):
        raise ValueError(f"configuration {text!r}: {loader} does not declare parallel start for {ctx}")
    return Config(loader, ctx, workers, parallelism)


def machine() -> dict[str, Any]:
    import psutil
    import torch

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in ("torch", "torchvision", "torchdata"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = None
    return {
        "cpu_model": model, "logical_cores": os.cpu_count(), "usable_cores": usable_cores(),
        "physical_cores": psutil.cpu_count(logical=False), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(), "python": platform.python_version(), **versions,
        "cuda": torch.cuda.is_available(),
    }


def trial_kwargs(cfg: Config, loader_payload: dict, dataset_kwargs: dict, batch_size: int, max_batches: int,
                 seed: int, epochs: int = 1) -> dict[str, Any]:
    base_ctx, _, extra = cfg.context.partition("+")
    return {
        "loader": loader_payload, "dataset": DATASET, "dataset_kwargs": dataset_kwargs,
        "loader_kwargs": {"num_workers": cfg.num_workers, "batch_size": batch_size, "shuffle": True,
                          "prefetch_factor": 2},
        "context": base_ctx, "parallelism": None if cfg.parallelism == 1 else cfg.parallelism,
        "max_batches": max_batches, "preload": list(PRELOAD) if extra == "preload" else [],
        "generator_seed": seed, "epochs": epochs,
    }


def _comparisons(configs: list[Config]) -> list[tuple[Config, Config, str]]:
    """(baseline, candidate, kind): serial vs parallel, and N workers vs 1 worker."""
    out = []
    for c in configs:
        if c.parallelism > 1:
            base = Config(c.loader, c.context, c.num_workers, 1)
            if base in configs:
                out.append((base, c, "parallel_vs_serial"))
        if c.num_workers > 1:
            one = Config(c.loader, c.context, 1, 1)
            if one in configs:
                out.append((one, c, "workers_vs_one"))
    return out


def summarize_results(configs: list[Config], raw: dict[str, list[dict]]) -> dict[str, Any]:
    out: dict[str, Any] = {"configs": {}, "comparisons": []}
    digests: dict[str, set[str]] = {}
    for c in configs:
        trials = raw[c.name]
        ok = [t for t in trials if "error" not in t]
        digests[c.name] = {t["first_batch_digest"] for t in ok}
        out["configs"][c.name] = {
            **dataclasses.asdict(c), "trials": trials, "errors": len(trials) - len(ok),
            "summary": {m: summarize([t[m] for t in ok]) for m in METRICS},
            "arrivals": arrival_summary([t.get("arrival_s") for t in ok]),
        }
        second = [t["epoch2"] for t in ok if t.get("epoch2")]
        if second:
            out["configs"][c.name]["epoch2"] = {
                "summary": {m: summarize([t[m] for t in second]) for m in EPOCH2_METRICS},
                "arrivals": arrival_summary([t["arrival_s"] for t in second])}
    for base, cand, kind in _comparisons(configs):
        a = [t.get("time_to_first_batch_s") for t in raw[base.name]]
        b = [t.get("time_to_first_batch_s") for t in raw[cand.name]]
        # candidate / baseline: < 1 is faster for parallel-vs-serial, >= 1 for workers-vs-one
        out["comparisons"].append({"kind": kind, "baseline": base.name, "candidate": cand.name,
                                   "metric": "time_to_first_batch_s", **paired_ratio(b, a)})
    out["digests"] = digest_summary(configs, digests)
    return out


def arrival_summary(series: list[list[float] | None]) -> dict[str, list[float]]:
    """Per batch k (1..the shortest series): median, p10 and p90 of its arrival time over trials."""
    series = [s for s in series if s]
    if not series:
        return {"median": [], "p10": [], "p90": [], "n": 0}
    per_k = [summarize([s[k] for s in series]) for k in range(min(len(s) for s in series))]
    return {q: [p[q] for p in per_k] for q in ("median", "p10", "p90")} | {"n": len(series)}


def first_to_deliver(result: dict[str, Any], epoch: int = 1) -> list[tuple[int, str]]:
    """For each batch k (1-based), the configuration whose median arrival was earliest."""
    curves = {}
    for name, cfg in result["configs"].items():
        arr = (cfg.get("epoch2") or {}).get("arrivals") if epoch == 2 else cfg.get("arrivals")
        if arr and arr["median"]:
            curves[name] = arr["median"]
    if not curves:
        return []
    k_max = min(len(v) for v in curves.values())
    return [(k + 1, min(curves, key=lambda n: curves[n][k])) for k in range(k_max)]


def digest_summary(configs: list[Config], digests: dict[str, set[str]]) -> dict[str, Any]:
    """``match``: every trial of each loader gave the same first batch (else exit 1).
    ``across_loaders``: and all loaders agree (same generator, same sampler
    contract); a difference there is a finding about a loader, reported loudly."""
    per_loader: dict[str, set[str]] = {}
    for c in configs:
        per_loader.setdefault(c.loader, set()).update(digests[c.name])
    everything = set().union(*per_loader.values()) if per_loader else set()
    return {"distinct": sorted(everything), "match": all(len(v) <= 1 for v in per_loader.values()),
            "across_loaders": len(everything) <= 1, "per_loader": {k: sorted(v) for k, v in per_loader.items()},
            "per_config": {k: sorted(v) for k, v in digests.items()}}


def run(args, progress) -> dict[str, Any]:
    if args.data_root:
        root = Path(args.data_root)
        checksum = (root / "CHECKSUM").read_text().split()[0] if (root / "CHECKSUM").exists() else None
    else:
        root, checksum = eurosat.make_dataset(per_class=args.per_class)
    specs = list(dict.fromkeys([c.rsplit("/", 3)[0] for c in args.config] if args.config else args.loader))
    under_tests = {spec: protocol.resolve(spec, None, None) for spec in specs}
    parallel = {spec: under_test.parallel_contexts() for spec, under_test in under_tests.items()}
    if args.config:
        configs = list(dict.fromkeys(parse_config(c, parallel) for c in args.config))
    else:
        configs = plan(args.loader, args.context, args.num_workers, args.parallelism, parallel)
    dataset_kwargs = {"root": str(root), "limit": args.limit}
    per = {c.name: trial_kwargs(c, under_tests[c.loader].payload(), dataset_kwargs, args.batch_size, args.max_batches,
                                args.seed, args.epochs)
           for c in configs}
    progress(f"{len(configs)} configurations x {args.trials} trials = {len(configs) * args.trials} fresh processes")
    raw = run_trials(per, args.trials, timeout=args.trial_timeout, progress=progress, keep_going=True)
    ds = eurosat.EuroSATLike(str(root), limit=args.limit)
    import pickle

    result = {
        "schema": SCHEMA, "label": args.label,
        "command": "python -m pytest_workerstart.bench " + shlex.join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": {"dataset": DATASET, "root": str(root), "tree_sha256": checksum, "images": len(ds),
                     "dataset_pickle_bytes": len(pickle.dumps(ds)), "batch_size": args.batch_size,
                     "max_batches": args.max_batches, "epochs": args.epochs, "prefetch_factor": 2,
                     "shuffle_seed": args.seed,
                     "preload": list(PRELOAD)},
        "loaders": {spec: under_test.describe() for spec, under_test in under_tests.items()},
        "trials_per_config": args.trials,
        **summarize_results(configs, raw),
    }
    return result


def compare(current: dict, baseline: dict, max_regression_pct: float) -> list[str]:
    """Configurations whose median time to first batch regressed by more than the limit."""
    problems = []
    for name, cur in current["configs"].items():
        base = baseline.get("configs", {}).get(name)
        if not base:
            continue
        c = cur["summary"]["time_to_first_batch_s"]["median"]
        b = base["summary"]["time_to_first_batch_s"]["median"]
        if b and c == c and c > b * (1 + max_regression_pct / 100):
            problems.append(f"{name}: median time to first batch {c:.2f} s vs baseline {b:.2f} s "
                            f"(+{(c / b - 1) * 100:.0f}% > {max_regression_pct:g}%)")
    return problems


def to_pytest_benchmark(result: dict) -> dict:
    """The time-to-first-batch trials in pytest-benchmark's storage format, so
    ``pytest-benchmark compare`` and its ``.benchmarks/`` history can read them."""
    stats = require("pytest_benchmark.stats", "--pytest-benchmark-json")

    benches = []
    for name, cfg in result["configs"].items():
        values = [t["time_to_first_batch_s"] for t in cfg["trials"] if "error" not in t]
        if not values:
            continue
        st = stats.Stats()
        for v in values:
            st.update(v)
        benches.append({"group": "time_to_first_batch", "name": name, "fullname": f"workerstart-bench::{name}",
                        "params": {k: cfg[k] for k in ("loader", "context", "num_workers", "parallelism")},
                        "param": name, "extra_info": {},
                        "options": {"timer": "perf_counter", "min_rounds": len(values)},
                        "stats": {**st.as_dict(), "iterations": 1, "data": values}})
    return {"machine_info": {"node": platform.node(), "processor": result["machine"]["cpu_model"],
                             "machine": platform.machine(), "python_version": result["machine"]["python"],
                             "python_implementation": platform.python_implementation(), "system": platform.system(),
                             "release": platform.release(), "cpu": result["machine"]},
            "commit_info": {}, "benchmarks": benches, "datetime": result["date"], "version": "4.0.0"}
