"""The benchmark figure (matplotlib), drawn only from a results JSON.

Top row and first bottom panel: grouped bars of medians with p10-p90 whiskers
and an outlined circle per raw trial, for iterator creation, time to first
batch, images/s and PSS, at one worker count. Then a paired slope panel (matched
serial/parallel trials of each loader and context) and a scaling panel (median
time to first batch against workers, with each series' one-worker time as the limit).
"""

from __future__ import annotations

from typing import Any

from pytest_workerstart.bench._optional import require

PANELS = (("iterator_creation_s", "iterator creation (s)"), ("time_to_first_batch_s", "time to first batch (s)"),
          ("steady_samples_per_s", "steady-state images/s"), ("pss_increase_mb", "process-tree PSS increase (MiB)"))


def _series(cfg: dict) -> str:
    return f"{cfg['loader']} {cfg['context']} p{'1' if cfg['parallelism'] == 1 else cfg['parallelism']}"


def _values(cfg: dict, metric: str) -> list[float]:
    return [t[metric] for t in cfg["trials"] if "error" not in t and t.get(metric) is not None]


def plot(result: dict[str, Any], output: str, workers: int | None = None) -> None:
    matplotlib = require("matplotlib", "plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(result["configs"].values())
    workers = workers or max(c["num_workers"] for c in configs)
    focus = [c for c in configs if c["num_workers"] == workers]
    colors = plt.get_cmap("tab10")
    color_of = {}
    for c in configs:
        color_of.setdefault(_series(c), colors(len(color_of) % 10))

    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    flat = axes.ravel()
    for ax, (metric, title) in zip([flat[0], flat[1], flat[2], flat[3]], PANELS, strict=False):
        for x, c in enumerate(focus):
            s = c["summary"][metric]
            col = color_of[_series(c)]
            if s["n"]:
                ax.bar(x, s["median"], color=col, alpha=0.75)
                ax.errorbar(x, s["median"], yerr=[[s["median"] - s["p10"]], [s["p90"] - s["median"]]],
                            color="black", capsize=4, lw=1)
                vals = _values(c, metric)
                ax.scatter([x] * len(vals), vals, facecolors="none", edgecolors="black", s=22, zorder=3)
        ax.set_xticks(range(len(focus)), [_series(c) for c in focus], rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{title}, {workers} workers", fontsize=10)
        ax.grid(axis="y", alpha=0.3)

    _slopes(flat[4], result, workers, color_of)
    _scaling(flat[5], configs, color_of)
    m = result["machine"]
    label = result.get("label") or ""
    fig.suptitle(f"Worker start, {result['workload']['images']} EuroSAT-like JPEGs, "
                 f"batch {result['workload']['batch_size']}"
                 f" - {label} {m['cpu_model']}, {m['usable_cores']} usable cores, {m['ram_gib']} GiB, "
                 f"Python {m['python']},"
                 f" torch {m['torch']} - medians, p10-p90 whiskers, circles = trials", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(output, dpi=110)
    plt.close(fig)


def _slopes(ax, result: dict, workers: int, color_of: dict) -> None:
    """Matched trials (trial j of serial with trial j of parallel), one line each."""
    pairs = [c for c in result["comparisons"] if c["kind"] == "parallel_vs_serial"
             and result["configs"][c["candidate"]]["num_workers"] == workers]
    for k, cmp in enumerate(pairs):
        a = result["configs"][cmp["baseline"]]
        b = result["configs"][cmp["candidate"]]
        col = color_of[_series(b)]
        for ta, tb in zip(a["trials"], b["trials"], strict=False):
            if "error" in ta or "error" in tb:
                continue
            ax.plot([2 * k, 2 * k + 1], [ta["time_to_first_batch_s"], tb["time_to_first_batch_s"]], "-o",
                    color=col, mfc="none", alpha=0.8)
        if cmp["ratio_of_medians"]:
            ax.annotate(f"x{1 / cmp['ratio_of_medians']:.2f} faster\n(pairs x{1 / cmp['median_pair_ratio']:.2f})",
                        (2 * k + 0.5, ax.get_ylim()[1] if ax.lines else 0), fontsize=7, ha="center", va="top")
    ax.set_xticks([i for k in range(len(pairs)) for i in (2 * k, 2 * k + 1)],
                  [lbl for c in pairs for lbl in ("p1", f"p{result['configs'][c['candidate']]['parallelism']}\n"
                                                  f"{result['configs'][c['candidate']]['loader']} "
                                                  f"{result['configs'][c['candidate']]['context']}")],
                  fontsize=6)
    ax.set_title(f"paired trials, {workers} workers: time to first batch (s)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def _scaling(ax, configs: list[dict], color_of: dict) -> None:
    by_series: dict[str, list[dict]] = {}
    for c in configs:
        key = f"{c['loader']} {c['context']}"
        kind = "serial" if c["parallelism"] == 1 else (
            "p=N" if c["parallelism"] == c["num_workers"] else f"p={c['parallelism']}")
        by_series.setdefault(f"{key} {kind}", []).append(c)
    limits = {}
    for name, cs in by_series.items():
        cs = sorted(cs, key=lambda c: c["num_workers"])
        one = next((c for c in configs if c["loader"] == cs[0]["loader"] and c["context"] == cs[0]["context"]
                    and c["num_workers"] == 1), None)
        pts = [(1, one)] + [(c["num_workers"], c) for c in cs if c["num_workers"] > 1]
        pts = [(n, c) for n, c in pts if c is not None and c["summary"]["time_to_first_batch_s"]["n"]]
        if len(pts) < 2:
            continue
        col = color_of.get(_series(cs[-1]), "gray")
        ax.plot([n for n, _ in pts], [c["summary"]["time_to_first_batch_s"]["median"] for _, c in pts], "-o",
                label=name, color=col, lw=1.2)
        one = pts[0][1]["summary"]["time_to_first_batch_s"]["median"]
        limits[f"{cs[0]['loader']} {cs[0]['context']}"] = one
    for one in limits.values():
        ax.axhline(one, ls=":", lw=0.8, color="gray")
    if limits:
        ax.text(1, min(limits.values()), " one worker (limit)", fontsize=7, va="bottom", color="gray")
    ax.set_xscale("log", base=2)
    ns = sorted({c["num_workers"] for c in configs})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("workers")
    ax.set_title("scaling: median time to first batch (s)", fontsize=10)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)


def plot_arrivals(result: dict[str, Any], output: str) -> None:
    """When batch k arrived (median, p10-p90 band) for every configuration; one panel per
    iterator (the second only for runs with ``--epochs 2``)."""
    matplotlib = require("matplotlib", "plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = result["configs"]
    second = any(c.get("epoch2") for c in configs.values())
    fig, axes = plt.subplots(1, 2 if second else 1, figsize=(16 if second else 9, 6), squeeze=False)
    colors = plt.get_cmap("tab10")
    for col, (title, pick) in enumerate([("1st iterator: time from the loader's constructor (s)",
                                          lambda c: c.get("arrivals")),
                                         ("2nd iterator (persistent_workers=False): time from its iter() (s)",
                                          lambda c: (c.get("epoch2") or {}).get("arrivals"))][:2 if second else 1]):
        ax = axes[0][col]
        for i, (name, cfg) in enumerate(configs.items()):
            arr = pick(cfg)
            if not arr or not arr["median"]:
                continue
            ks = range(1, len(arr["median"]) + 1)
            ax.plot(ks, arr["median"], "-", color=colors(i % 10), lw=1.4, label=name)
            ax.fill_between(ks, arr["p10"], arr["p90"], color=colors(i % 10), alpha=0.15, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("batch k")
        ax.set_ylabel("arrival (s, log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"Arrival of batch k - {result.get('label') or ''} {m['cpu_model']}, {m['usable_cores']} usable "
                 f"cores, Python {m['python']}, torch {m['torch']} - medians over {result['trials_per_config']} "
                 "fresh-process trials, p10-p90 bands", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(output, dpi=110)
    plt.close(fig)
