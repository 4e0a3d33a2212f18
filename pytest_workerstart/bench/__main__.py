"""``python -m pytest_workerstart.bench``: run the startup benchmark, or plot its JSON.

    python -m pytest_workerstart.bench --make-dataset
    python -m pytest_workerstart.bench --loader reference torch torchdata \\
        --context spawn forkserver --num-workers 1 2 4 8 --parallelism 1 N \\
        --trials 5 --max-batches 100 --json results.json
    python -m pytest_workerstart.bench plot results.json -o fig.png
    python -m pytest_workerstart.bench arrivals results.json -o fig.png    # batch k's arrival, per configuration
    python -m pytest_workerstart.bench epochs results.json                 # the second-epoch targets (markdown)
    python -m pytest_workerstart.bench table results.json [more.json ...]   # markdown
    python -m pytest_workerstart.bench targets results.json                 # the reference loader's targets
    python -m pytest_workerstart.bench suite --loader reference torch --profile quick full --json suite.json
    python -m pytest_workerstart.bench suite-table suite.json               # the suite's time to verdict (markdown)
    python -m pytest_workerstart.bench soak --json soak.json                # iterator lifecycles, resources sampled
    python -m pytest_workerstart.bench soak-table soak.json                 # flat or not, per resource (markdown)
    python -m pytest_workerstart.bench soak-plot soak.json -o soak.png
    python -m pytest_workerstart.bench api-soak --runs 20 --json api-soak.json   # check_loader in a loop
    python -m pytest_workerstart.bench explore-power --seeds 20 --json power.json   # the explorer's finding rate

Exit status: 0 ok; 1 first-batch digests differ, a trial failed, or ``--compare``
found a regression; 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pytest_workerstart.bench import api_soak, eurosat, explore_power, report, run, soak, suite
from pytest_workerstart.bench._optional import require
from pytest_workerstart.bench.eurosat import EUROSAT_PER_CLASS
from pytest_workerstart.bench.plot import plot, plot_arrivals
from pytest_workerstart.bench.run import CONTEXTS
from pytest_workerstart.protocol import SpecError


def _progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench",
                                description="Worker-start benchmark on a EuroSAT-like JPEG set "
                                            "(see docs/benchmark.md).")
    p.add_argument("--loader", nargs="+", default=["reference"], metavar="SPEC",
                   help="reference, torch, torchdata or module:attr (as for --workerstart-loader)")
    p.add_argument("--context", nargs="+", default=["spawn"], choices=CONTEXTS)
    p.add_argument("--num-workers", nargs="+", type=int, default=[8])
    p.add_argument("--parallelism", nargs="+", default=["1", "N"],
                   help="values of the parallelism argument: integers, N (= workers) or cores (= usable cores)")
    p.add_argument("--config", nargs="+", default=[], metavar="LOADER/CONTEXT/wN/pP",
                   help="exact configurations instead of the --loader x --context x --num-workers x "
                        "--parallelism product, e.g. torch/spawn/w1/p1 reference/forkserver/w8/pcores")
    p.add_argument("--trials", type=int, default=5, help="fresh-process trials per configuration")
    p.add_argument("--max-batches", type=int, default=100, help="steady state is measured over batches 2..max")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1, choices=(1, 2),
                   help="2: drop the first iterator after --max-batches and time a second one (a new epoch)")
    p.add_argument("--data-root", help="an existing EuroSAT folder (used unchanged) instead of the generated set")
    p.add_argument("--make-dataset", action="store_true",
                   help="generate (or verify) the offline set, print its path, exit")
    p.add_argument("--per-class", type=int, default=EUROSAT_PER_CLASS,
                   help="generated images per class (EuroSAT: 2700)")
    p.add_argument("--limit", type=int, default=None, help="use only this many images (a reduced workload)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle generator")
    p.add_argument("--trial-timeout", type=float, default=600.0)
    p.add_argument("--label", default="", help="a description of the machine for the figure and JSON")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write every raw value and summary here")
    p.add_argument("--pytest-benchmark-json", metavar="OUT",
                   help="also write the time-to-first-batch trials in pytest-benchmark's format")
    p.add_argument("--compare", metavar="BASELINE.json", help="fail if a median time to first batch regressed")
    p.add_argument("--max-regression", type=float, default=10.0, metavar="PCT")
    return p


def plot_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_workerstart.bench plot")
    p.add_argument("results")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--workers", type=int, default=None,
                   help="worker count of the bar and slope panels (default: largest)")
    return p


def print_table(result: dict) -> None:
    rows = [("configuration", "iter (s)", "first batch (s) p10-p90", "images/s", "PSS +MiB", "errors")]
    for name, cfg in result["configs"].items():
        s = cfg["summary"]
        t = s["time_to_first_batch_s"]
        rows.append((name, f"{s['iterator_creation_s']['median']:.2f}",
                     f"{t['median']:.2f} ({t['p10']:.2f}-{t['p90']:.2f})",
                     f"{s['steady_samples_per_s']['median']:.0f}", f"{s['pss_increase_mb']['median']:.0f}",
                     str(cfg["errors"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)))
    for c in result["comparisons"]:
        if c["ratio_of_medians"] is not None:
            print(f"{c['candidate']} / {c['baseline']}: first batch x{c['ratio_of_medians']:.2f} "
                  f"(median pair ratio x{c['median_pair_ratio']:.2f})")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["table"], ["targets"], ["epochs"], ["suite-table"]):
        results = []
        for path in argv[1:]:
            with open(path) as f:
                results.append(json.load(f))
        if not results:
            print(f"usage: python -m pytest_workerstart.bench {argv[0]} RESULTS.json [...]", file=sys.stderr)
            return 2
        sys.stdout.write(suite.render(results) if argv[0] == "suite-table" else report.render(argv[0], results))
        return 0
    if argv[:1] == ["explore-power"]:
        return explore_power.main(argv[1:])
    if argv[:1] == ["soak"]:
        return soak.main(argv[1:])
    if argv[:1] == ["api-soak"]:
        return api_soak.main(argv[1:])
    if argv[:1] in (["soak-table"], ["soak-plot"]):
        a = plot_parser().parse_args(argv[1:]) if argv[0] == "soak-plot" else None
        with open(a.results if a else argv[1]) as f:
            result = json.load(f)
        if a is None:
            sys.stdout.write(soak.table(result))
        else:
            soak.plot(result, a.output)
            print(a.output)
        return 0
    if argv[:1] == ["suite"]:
        return suite.main(argv[1:])
    if argv[:1] in (["plot"], ["arrivals"]):
        require("matplotlib", "plotting")
    if argv[:1] == ["plot"]:
        a = plot_parser().parse_args(argv[1:])
        with open(a.results) as f:
            plot(json.load(f), a.output, workers=a.workers)
        print(a.output)
        return 0
    if argv[:1] == ["arrivals"]:
        a = plot_parser().parse_args(argv[1:])
        with open(a.results) as f:
            plot_arrivals(json.load(f), a.output)
        print(a.output)
        return 0
    args = run_parser().parse_args(argv)

    if args.make_dataset:
        t0 = time.perf_counter()
        root, checksum = eurosat.make_dataset(args.data_root, per_class=args.per_class)
        print(f"{root}  sha256={checksum}  ({time.perf_counter() - t0:.1f} s)")
        return 0
    try:
        for token in args.parallelism:
            run.parse_parallelism(token, 1)
    except ValueError as exc:
        print(f"ERROR: --parallelism: {exc}", file=sys.stderr)
        return 2

    try:
        for text in args.config:
            run.parse_config(text, {text.rsplit("/", 3)[0]: run.CONTEXTS})  # syntax only; loaders resolved by run
    except ValueError as exc:
        print(f"ERROR: --config: {exc}", file=sys.stderr)
        return 2
    try:
        result = run.run(args, _progress)
    except (SpecError, ValueError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    if args.pytest_benchmark_json:
        with open(args.pytest_benchmark_json, "w") as f:
            json.dump(run.to_pytest_benchmark(result), f, indent=1)
    print_table(result)
    status = 0
    if not result["digests"]["match"]:
        print("ERROR: first-batch digests differ between trials of the same loader:", file=sys.stderr)
        for name, ds in result["digests"]["per_config"].items():
            print(f"  {name}: {', '.join(d[:16] for d in ds)}", file=sys.stderr)
        status = 1
    elif not result["digests"]["across_loaders"]:
        print("WARNING: loaders disagree on the first batch for the same generator (each is self-consistent):",
              file=sys.stderr)
        for name, ds in result["digests"]["per_loader"].items():
            print(f"  {name}: {', '.join(d[:16] for d in ds)}", file=sys.stderr)
    failed = {n: c["errors"] for n, c in result["configs"].items() if c["errors"]}
    if failed:
        print(f"ERROR: failed trials: {failed}", file=sys.stderr)
        status = 1
    if args.compare:
        with open(args.compare) as f:
            problems = run.compare(result, json.load(f), args.max_regression)
        for line in problems:
            print(f"REGRESSION: {line}", file=sys.stderr)
        status = status or (1 if problems else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
