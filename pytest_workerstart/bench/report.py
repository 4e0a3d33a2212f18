"""Markdown tables from results JSON (the committed docs are rendered by this).

    python -m pytest_workerstart.bench table loaders.json scaling.json > docs/bench/results.md
    python -m pytest_workerstart.bench targets loaders.json > docs/bench/reference.md
"""

from __future__ import annotations

from typing import Any, Iterable

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
            f"Python {m['python']}, torch {m['torch']}, torchvision {m['torchvision']}, torchdata {m.get('torchdata')}, "
            f"{result['workload']['images']} images, batch {result['workload']['batch_size']}, "
            f"{result['workload']['max_batches']} batches, {result['trials_per_config']} trials per row, {result['date']}")


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


def render(kind: str, results: list[dict[str, Any]]) -> str:
    return table(results) if kind == "table" else targets(results[0])
