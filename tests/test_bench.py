"""The benchmark: offline dataset, fresh-process harness, JSON, figure, --compare."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from pytest_workerstart.bench import eurosat, run
from pytest_workerstart.bench.__main__ import main

BROKEN = "pytest_workerstart.fixtures.broken.loaders:ExtraGeneratorDraw"


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    root, checksum = eurosat.make_dataset(tmp_path_factory.mktemp("euro") / "set", per_class=8)
    return root, checksum


def test_dataset_is_deterministic_eurosat_shaped_and_verified(small_set, tmp_path):
    root, checksum = small_set
    again, checksum2 = eurosat.make_dataset(tmp_path / "again", per_class=8)
    assert checksum2 == checksum
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(eurosat.SOURCES)
    ds = eurosat.EuroSATLike(str(root))
    assert isinstance(ds, ImageFolder) and len(ds) == 80
    image, target = ds[0]
    assert tuple(image.shape) == (3, 224, 224) and target == 0
    assert eurosat.read_image(ds.samples[0][0]).shape == (3, 64, 64)
    # a tampered tree is refused, not silently used
    victim = next(root.rglob("*.jpg"))
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    try:
        with pytest.raises(RuntimeError, match="does not match its CHECKSUM"):
            eurosat.make_dataset(root, per_class=8)
    finally:
        victim.write_bytes(data)


def test_full_size_pickle_exceeds_the_pipe_buffer(small_set):
    # 27,000 samples pickle to about 1.3 MB; the per-sample cost is what matters.
    ds = eurosat.EuroSATLike(str(small_set[0]))
    per_sample = len(pickle.dumps(ds)) / len(ds)
    assert per_sample * 27_000 > 20 * 64 * 1024


def test_plan_skips_parallel_where_not_declared():
    cfgs = run.plan(["reference", "torch"], ["spawn", "forkserver+preload"], [1, 4], ["1", "N", "2"],
                    {"reference": ("spawn", "forkserver"), "torch": ()})
    names = [c.name for c in cfgs]
    assert "torch/spawn/w4/p4" not in names and "torch/spawn/w4/p1" in names
    assert "reference/forkserver+preload/w4/p4" in names and "reference/spawn/w4/p2" in names
    assert "reference/spawn/w1/p1" in names and len(names) == len(set(names))


def _cli(args, tmp_path):
    out = tmp_path / "r.json"
    code = main([*args, "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_run_records_raw_trials_machine_and_ratios_then_plots_and_compares(small_set, tmp_path, capsys):
    root, checksum = small_set
    code, res = _cli(["--data-root", str(root), "--loader", "reference", "--context", "forkserver",
                      "--num-workers", "1", "2", "--parallelism", "1", "N", "--trials", "2", "--max-batches", "3",
                      "--batch-size", "8"], tmp_path)
    assert code == 0, capsys.readouterr().err[-2000:]
    assert res["workload"]["tree_sha256"] == checksum and res["workload"]["images"] == 80
    assert {"cpu_model", "usable_cores", "ram_gib", "python", "torch", "torchvision"} <= set(res["machine"])
    assert set(res["configs"]) == {"reference/forkserver/w1/p1", "reference/forkserver/w2/p1",
                                   "reference/forkserver/w2/p2"}
    for cfg in res["configs"].values():
        assert len(cfg["trials"]) == 2 and cfg["errors"] == 0
        assert set(run.METRICS) <= set(cfg["trials"][0]) and "first_batch_digest" in cfg["trials"][0]
        assert cfg["summary"]["time_to_first_batch_s"]["n"] == 2
    assert res["digests"]["match"] and len(res["digests"]["distinct"]) == 1
    kinds = {(c["kind"], c["candidate"]) for c in res["comparisons"]}
    assert ("parallel_vs_serial", "reference/forkserver/w2/p2") in kinds
    assert all(c["ratio_of_medians"] > 0 for c in res["comparisons"])
    err = capsys.readouterr().err
    assert "trial 6/6" in err  # progress on stderr

    png = tmp_path / "fig.png"
    assert main(["plot", str(tmp_path / "r.json"), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --compare: against a baseline twice as fast, every configuration regressed
    base = json.loads((tmp_path / "r.json").read_text())
    for cfg in base["configs"].values():
        cfg["summary"]["time_to_first_batch_s"]["median"] /= 2
    assert run.compare(res, base, 10.0) and not run.compare(res, res, 10.0)

    # pytest-benchmark's own reader accepts the export
    pb = tmp_path / "pb.json"
    pb.write_text(json.dumps(run.to_pytest_benchmark(res)))
    cli = Path(sys.executable).parent / "pytest-benchmark"
    shown = subprocess.run([str(cli), "compare", str(pb)], capture_output=True, text=True)
    assert shown.returncode == 0 and "reference/forkserver/w2/p2" in shown.stdout, shown.stderr[-1500:]


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_mismatched_first_batch_digest_fails_loudly(small_set, tmp_path, capsys):
    # ExtraGeneratorDraw's parallel path consumes a draw of the generator: its
    # p=1 and p=2 first batches differ, which is a determinism bug: exit 1.
    code, res = _cli(["--data-root", str(small_set[0]), "--loader", BROKEN, "--context", "forkserver",
                      "--num-workers", "2", "--parallelism", "1", "N", "--trials", "1", "--max-batches", "2",
                      "--batch-size", "8"], tmp_path)
    assert code == 1 and not res["digests"]["match"]
    assert "first-batch digests differ between trials of the same loader" in capsys.readouterr().err


def test_loaders_that_disagree_are_reported_but_each_may_be_consistent():
    from pytest_workerstart.bench.run import Config, digest_summary

    cfgs = [Config("a", "spawn", 2, 1), Config("b", "spawn", 2, 1)]
    same = digest_summary(cfgs, {"a/spawn/w2/p1": {"x"}, "b/spawn/w2/p1": {"x"}})
    differ = digest_summary(cfgs, {"a/spawn/w2/p1": {"x"}, "b/spawn/w2/p1": {"y"}})
    broken = digest_summary(cfgs, {"a/spawn/w2/p1": {"x", "z"}, "b/spawn/w2/p1": {"x"}})
    assert same["match"] and same["across_loaders"]
    assert differ["match"] and not differ["across_loaders"]
    assert not broken["match"]


def test_bad_loader_spec_is_one_line_usage_error(small_set, capsys):
    code = main(["--data-root", str(small_set[0]), "--loader", "no_such_module:Loader", "--trials", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ERROR: ") and "no_such_module" in err[0]


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_exact_configs_two_epochs_arrivals_and_epoch_targets(small_set, tmp_path, capsys):
    """--config picks configurations; --epochs 2 times a second iterator; every batch's arrival is kept,
    summarised per k, drawn, and the issue-16 targets table renders from it."""
    code, res = _cli(["--data-root", str(small_set[0]), "--config", "torch/spawn/w1/p1", "reference/forkserver/w2/pN",
                      "--epochs", "2", "--trials", "2", "--max-batches", "4", "--batch-size", "8"], tmp_path)
    assert code == 0, capsys.readouterr().err[-2000:]
    assert list(res["configs"]) == ["torch/spawn/w1/p1", "reference/forkserver/w2/p2"]
    for cfg in res["configs"].values():
        for t in cfg["trials"]:
            arr = t["arrival_s"]
            assert len(arr) == 4 and arr == sorted(arr) and arr[0] == t["time_to_first_batch_s"]
            assert len(t["epoch2"]["arrival_s"]) == 4 and t["epoch2"]["time_to_first_batch_s"] > 0
        assert len(cfg["arrivals"]["median"]) == 4 and cfg["arrivals"]["n"] == 2
        assert len(cfg["epoch2"]["arrivals"]["p90"]) == 4
    assert res["digests"]["match"] and res["digests"]["across_loaders"]
    firsts = run.first_to_deliver(res, 2)
    assert [k for k, _ in firsts] == [1, 2, 3, 4] and {n for _, n in firsts} <= set(res["configs"])
    png = tmp_path / "arrivals.png"
    assert main(["arrivals", str(tmp_path / "r.json"), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["epochs", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    assert "first batch, 2nd iterator" in text and "which configuration delivered batch k first" in text


@pytest.mark.parametrize("bad", ["torch/spawn/8/p1", "torch/nope/w8/p1", "torch/spawn/w8/px", "torch/spawn/w8/p2"])
def test_bad_config_is_one_line_usage_error(small_set, capsys, bad):
    code = main(["--data-root", str(small_set[0]), "--config", bad, "--trials", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ERROR: ") and bad in err[0], err
