"""Markdown tables from results JSON (the committed docs are rendered by this).

    python -m pytest_workerstart.bench table loaders.json scaling.json > docs/bench/results.md
    python -m pytest_workerstart.bench targets loaders.json > docs/bench/reference.md
    python -m pytest_workerstart.bench epochs epochs.json > docs/bench/epochs.md
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_workerstart.bench.run import first_to_deliver
from pytest_workerstart.probes.timing import paired_ratio


def _fmt(s: dict, digits: int = 2) -> str:
    if not s.get("n"):
        return "–"
    return f"{s['median']:.{digits}f} ({s['p10']:.{digits}f}–{s['p90']:.{digits}f})"


def _med(s: dict, digits: int = 0) -> str:
    return f"{s['median']:.{digits}f}" if s.get("n") else "–"


def machine_line(result: dict) -> str:
    m = result["machine"]
    label = f"{result['label']}: " if result.get("label") else ""
    return (f"{label}{m['cpu_model']}, {m['usable_cores']} usable cores, {m['ram_gib']} GiB RAM, "
            f"Python {m['python']}, torch {m['torch']}, torchvision {m['torchvision']}, "
            f"torchdata {m.get('torchdata')}, "
            f"{result['workload']['images']} images, batch {result['workload']['batch_size']}, "
            f"{result['workload']['max_batches']} batches, {result['trials_per_config']} trials per row, "
            f"{result['date']}")


def table(results: Iterable[dict]) -> str:
    out = []
    for r in results:
        out.append(f"`{r['command']}`\n\n{machine_line(r)}\n")
        out.append("| loader | context | workers | p | first batch, s | iterator creation, s | images/s (2..max) "
                   "| images/s (warm) | last batch, s | PSS increase, MiB |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for cfg in r["configs"].values():
            s = cfg["summary"]
            out.append(f"| {cfg['loader']} | {cfg['context']} | {cfg['num_workers']} | {cfg['parallelism']} | "
                       f"{_fmt(s['time_to_first_batch_s'])} | {_fmt(s['iterator_creation_s'])} | "
                       f"{_med(s['steady_samples_per_s'])} | {_med(s.get('warm_samples_per_s', {}))} | "
                       f"{_med(s.get('time_to_last_batch_s', {}), 1)} | {_med(s['pss_increase_mb'])} |")
        out.append("")
        per = r["digests"].get("per_loader", {})
        out.append(f"First-batch SHA-256 identical across every trial of each loader: "
                   f"**{'yes' if r['digests']['match'] else 'NO'}**; "
                   + "; ".join(f"{k}: `{', '.join(d[:16] for d in v)}`" for k, v in per.items()) + ".\n")
    return "\n".join(out)


def _get(result: dict, loader: str, ctx: str, workers: int, p: int) -> dict | None:
    return result["configs"].get(f"{loader}/{ctx}/w{workers}/p{p}")


def _cmp(a: dict | None, b: dict | None, metric: str) -> dict[str, float | None]:
    """a/b for one metric over two configurations' alternated trials."""
    if not a or not b:
        return {"ratio_of_medians": None, "median_pair_ratio": None}
    return paired_ratio(*([None if "error" in t else t.get(metric) for t in c["trials"]] for c in (a, b)))


def _ratio(a: dict | None, b: dict | None, metric: str) -> float | None:
    return _cmp(a, b, metric)["ratio_of_medians"]


def targets(result: dict, workers: int = 8) -> str:
    """The reference loader's targets: first batch at one worker's boot, no cost after."""
    lines = [f"`{result['command']}`\n", machine_line(result) + "\n",
             "| context | p | first batch N/1 worker (target ≤ 1.25) | pairs | images/s vs torch, 2..max | "
             "images/s vs torch, warm (target ≥ 0.97) | PSS vs serial (target ≤ 1.05) | last batch vs serial |",
             "|---|---|---|---|---|---|---|---|"]
    contexts = sorted({c["context"] for c in result["configs"].values() if c["loader"] == "reference"})
    for ctx in contexts:
        one = _get(result, "reference", ctx, 1, 1)
        serial = _get(result, "reference", ctx, workers, 1)
        torch_n = _get(result, "torch", ctx, workers, 1)
        ps = sorted(c["parallelism"] for c in result["configs"].values()
                    if c["loader"] == "reference" and c["context"] == ctx and c["num_workers"] == workers)
        for p in ps:
            cand = _get(result, "reference", ctx, workers, p)
            first = _cmp(cand, one, "time_to_first_batch_s")
            cells = [first["ratio_of_medians"], first["median_pair_ratio"],
                     _ratio(cand, torch_n, "steady_samples_per_s"), _ratio(cand, torch_n, "warm_samples_per_s"),
                     _ratio(cand, serial, "pss_increase_mb"), _ratio(cand, serial, "time_to_last_batch_s")]
            lines.append(f"| {ctx} | {p} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in cells) + " |")
    lines.append("")
    per = result["digests"].get("per_loader", {})
    same = per.get("reference") is not None and per.get("reference") == per.get("torch") and result["digests"]["match"]
    lines.append(f"First-batch SHA-256 of the reference identical to torch DataLoader's in every trial: "
                 f"**{'yes' if same else 'NO'}**.")
    return "\n".join(lines) + "\n"


def _arrival_cmp(a: dict | None, b: dict | None, k: int, epoch2: bool = False) -> dict[str, float | None]:
    """a/b for the arrival time of batch k (1-based) over alternated trials."""
    if not a or not b:
        return {"ratio_of_medians": None, "median_pair_ratio": None}

    def series(c):
        out = []
        for t in c["trials"]:
            arr = None if "error" in t else ((t.get("epoch2") or {}).get("arrival_s") if epoch2 else t.get("arrival_s"))
            out.append(arr[k - 1] if arr and len(arr) >= k else None)
        return out

    return paired_ratio(series(a), series(b))


def _row(what: str, target: str, ok, cmp: dict, note: str = "") -> str:
    r, p = cmp["ratio_of_medians"], cmp["median_pair_ratio"]
    met = "–" if r is None else ("**yes**" if ok(r) else "**no**")
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731 - a ratio near its bound must not round onto it
    return f"| {what} | {target} | {fmt(r)} | {fmt(p)} | {met} | {note} |"


def epochs(result: dict, workers: int = 8) -> str:
    """Issue #16's targets: the reference with its own preloaded forkserver (p = usable
    cores) against torch's DataLoader, from a run with ``--epochs 2``."""
    cores = min(result["machine"]["usable_cores"], workers)
    ref = _get(result, "reference", "forkserver", workers, cores)
    ref16 = _get(result, "reference", "forkserver", 2 * workers, min(result["machine"]["usable_cores"], 2 * workers))
    one = _get(result, "torch", "spawn", 1, 1)
    serial = _get(result, "torch", "spawn", workers, 1)
    lines = [f"`{result['command']}`\n", machine_line(result) + "\n",
             f"Candidate: reference, forkserver (its own server), {workers} workers, p = {cores}. Ratios of medians "
             "over alternated fresh-process trials; \"pairs\": the median of per-pair ratios. Times from the start "
             "of the loader's constructor.\n",
             "| target | bound | measured | pairs | met | against |", "|---|---|---|---|---|---|"]
    lines.append(_row("first batch, 1st iterator", "≤ 1.0", lambda r: r <= 1.0,
                      _cmp(ref, one, "time_to_first_batch_s"), "torch, spawn, 1 worker"))
    second = {"ratio_of_medians": None, "median_pair_ratio": None}
    if ref and one:
        second = paired_ratio([None if "error" in t or not t.get("epoch2") else t["epoch2"]["time_to_first_batch_s"]
                               for t in ref["trials"]],
                              [None if "error" in t else t["time_to_first_batch_s"] for t in one["trials"]])
    lines.append(_row("first batch, 2nd iterator (`persistent_workers=False`)", "≤ 0.2", lambda r: r <= 0.2, second,
                      "torch, spawn, 1 worker, 1st iterator"))
    lines.append(_row("images/s over batches 2..max, 1st iterator", "≥ 0.97", lambda r: r >= 0.97,
                      _cmp(ref, serial, "steady_samples_per_s"), f"torch, spawn, {workers} workers (serial start)"))
    worst = None
    if ref and serial:
        n = min(len(ref["arrivals"]["median"]), len(serial["arrivals"]["median"]))
        ratios = [(_arrival_cmp(ref, serial, k), k) for k in range(1, n + 1)]
        ratios = [(c, k) for c, k in ratios if c["ratio_of_medians"] is not None]
        if ratios:
            worst = max(ratios, key=lambda ck: ck[0]["ratio_of_medians"])
    lines.append(_row("batch k arrival, every k (the latest shown)", "≤ 1.0", lambda r: r <= 1.0,
                      worst[0] if worst else {"ratio_of_medians": None, "median_pair_ratio": None},
                      f"torch, spawn, {workers} workers (serial start); worst k = {worst[1] if worst else '–'}"))
    lines.append(_row(f"PSS increase, {workers} workers", "≤ 0.25", lambda r: r <= 0.25,
                      _cmp(ref, serial, "pss_increase_mb"), f"torch, spawn, {workers} workers"))
    lines.append(_row(f"{2 * workers} workers, first batch", "≤ 1.2", lambda r: r <= 1.2,
                      _cmp(ref16, ref, "time_to_first_batch_s"), f"the same at {workers} workers"))
    lines += ["", arrivals_table(result), "", first_to_deliver_table(result, 1), "",
              first_to_deliver_table(result, 2)]
    return "\n".join(lines) + "\n"


def arrivals_table(result: dict) -> str:
    """Per configuration: both iterators' milestones, medians with p10-p90."""
    out = ["| configuration | first batch, s | batch 10, s | last batch, s | images/s 2..max | PSS +MiB "
           "| 2nd iterator: drop 1st, s | first batch, s | last batch, s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, cfg in result["configs"].items():
        arr, e2 = cfg.get("arrivals") or {}, cfg.get("epoch2") or {}
        a2 = e2.get("arrivals") or {}

        def at(a: dict, k: int) -> str:
            m = a.get("median") or []
            if len(m) < k:
                return "–"
            return f"{m[k - 1]:.2f} ({a['p10'][k - 1]:.2f}–{a['p90'][k - 1]:.2f})"

        last = len(arr.get("median") or [])
        s2 = e2.get("summary") or {}
        out.append(f"| {name} | {at(arr, 1)} | {at(arr, 10)} | {at(arr, last)} | "
                   f"{_med(cfg['summary']['steady_samples_per_s'])} | {_med(cfg['summary']['pss_increase_mb'])} | "
                   f"{_fmt(s2['shutdown_s']) if s2 else '–'} | {at(a2, 1)} | {at(a2, len(a2.get('median') or []))} |")
    return "\n".join(out)


def first_to_deliver_table(result: dict, epoch: int) -> str:
    """Which configuration's median arrival of batch k was earliest, as runs of k."""
    firsts = first_to_deliver(result, epoch)
    if not firsts:
        return f"(no arrival times for iterator {epoch})"
    runs: list[list] = []
    for k, name in firsts:
        if runs and runs[-1][2] == name and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k, name])
    out = [f"Iterator {epoch}: which configuration delivered batch k first (median arrival)", "",
           "| batches | first | its median arrival, s |", "|---|---|---|"]
    for lo, hi, name in runs:
        cfg = result["configs"][name]
        med = ((cfg.get("epoch2") or {}).get("arrivals") if epoch == 2 else cfg["arrivals"])["median"]
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        out.append(f"| {span} | {name} | {med[lo - 1]:.2f}" + (f"–{med[hi - 1]:.2f}" if hi > lo else "") + " |")
    return "\n".join(out)


def render(kind: str, results: list[dict[str, Any]]) -> str:
    if kind == "epochs":
        return epochs(results[0])
    return table(results) if kind == "table" else targets(results[0])
