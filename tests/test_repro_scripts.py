"""Standalone reproducers (pytest_workerstart/repro/, written for torch in docs/results/repro/):
torch and the standard library only, exit 1 on stock torch and 0 on the reference, and
``--workerstart-repro`` writes them for the ids that failed."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_workerstart import registry, repro

COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "results" / "repro"
TORCH = "torch.utils.data.dataloader:DataLoader"
IDS = sorted(repro.available())
LOADERS = {TORCH: 1, "pytest_workerstart.reference:ParallelStartDataLoader": 0}
#: scripts that take a context (their default is spawn): torch fails each in the one named, at the cost of no boot
CONTEXT = {"failure.child_hang_during_start": "fork", "failure.child_killed_during_start": "fork",
           "failure.worker_init_error": "fork",
           "failure.interrupt_during_start": "fork"}


def test_each_reproducer_names_a_check_id_and_the_committed_ones_are_torchs():
    assert IDS and all(i in registry.CHECKS and f"``{i}``" in repro.available()[i].read_text() for i in IDS)
    assert sorted(p.name for p in COMMITTED.glob("*.py")) == sorted(repro.script_name(i) for i in IDS)
    for check_id in IDS:
        assert (COMMITTED / repro.script_name(check_id)).read_text() == repro.source(check_id, TORCH), check_id


@pytest.mark.parametrize("check_id", IDS)
def test_needs_only_torch_and_the_standard_library(check_id):
    modules = set()
    for node in ast.walk(ast.parse(repro.available()[check_id].read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules - set(sys.stdlib_module_names) <= {"torch"}, modules


@pytest.mark.suite  # each boots spawn workers
@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("check_id", IDS)
def test_fails_on_torch_and_passes_on_the_reference(check_id, loader, tmp_path):
    script = COMMITTED / repro.script_name(check_id)
    proc = subprocess.run([sys.executable, str(script), loader, *CONTEXT.get(check_id, "").split()], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == LOADERS[loader], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("ok:" if LOADERS[loader] == 0 else "expected:")


@pytest.mark.timeout(600)
def test_the_option_writes_one_for_each_failed_id_that_has_one(run_suite, tmp_path):
    out = tmp_path / "repro"
    # built on torch's DataLoader: fails child_exit as torch does, and worker_seeds, which has no script.
    # Forkserver, not fork: under fork torch may learn of the exit from its SIGCHLD handler, whose
    # exception need not hold the iterator, so whether torch passes the leak rule depends on timing.
    spec = "pytest_workerstart.fixtures.broken.on_torch:ConstantWorkerSeeds"
    verdict = run_suite(f"--workerstart-loader={spec}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "--workerstart-preflight=false",
                        "-k", "child_exit or worker_seeds", f"--workerstart-repro={out}")
    made = verdict.data["reproducers"]
    assert made == {"directory": str(out), "none_for": ["order.worker_seeds"],
                    "written": {"failure.child_exit_during_start": str(out / "failure_child_exit_during_start.py")}}
    assert "none exists for order.worker_seeds" in verdict.result.stdout.str()
    proc = subprocess.run([sys.executable, made["written"]["failure.child_exit_during_start"]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1 and json.dumps(spec) in Path(made["written"][
        "failure.child_exit_during_start"]).read_text(), proc.stdout[-2000:]


@pytest.mark.suite  # boots fork workers
def test_the_interrupt_reproducer_judges_the_loader_when_sigint_is_inherited_ignored(tmp_path):
    """A script's background job starts with SIGINT ignored; the reproducer's Ctrl-C must still land."""
    import signal

    script = COMMITTED / repro.script_name("failure.interrupt_during_start")
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.run([sys.executable, str(script), "pytest_workerstart.reference:ParallelStartDataLoader",
                               "fork"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    finally:
        signal.signal(signal.SIGINT, old)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
