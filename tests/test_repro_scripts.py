"""The standalone reproducers in docs/results/repro/: torch and the standard library only,
exit 1 on stock torch and 0 on the reference."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parent.parent / "docs" / "results" / "repro"
SCRIPTS = sorted(REPRO.glob("*.py"))
LOADERS = {"torch.utils.data:DataLoader": 1, "pytest_workerstart.reference:ParallelStartDataLoader": 0}


def test_there_are_reproducers_and_each_names_a_check_id():
    from pytest_workerstart import registry

    assert SCRIPTS
    for script in SCRIPTS:
        check_id = script.stem.replace("_", ".", 1)
        assert check_id in registry.CHECKS and f"``{check_id}``" in script.read_text(), script.name


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_needs_only_torch_and_the_standard_library(script):
    modules = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules - set(sys.stdlib_module_names) <= {"torch"}, modules


@pytest.mark.suite  # each boots spawn workers
@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_fails_on_torch_and_passes_on_the_reference(script, loader, tmp_path):
    proc = subprocess.run([sys.executable, str(script), loader], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == LOADERS[loader], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("ok:" if LOADERS[loader] == 0 else "expected:")
