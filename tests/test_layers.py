"""The layers are enforced by a tool (import-linter's contracts in pyproject.toml, run by
``make lint``): they hold for the package, and an import that goes up a layer breaks them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def copy(tmp_path):
    """The package and its contracts in a folder of their own (lint-imports reads the package
    from its working directory)."""
    shutil.copytree(ROOT / "pytest_workerstart", tmp_path / "pytest_workerstart",
                    ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_contracts_hold(copy):
    proc = _lint(copy)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("module, upward", [
    ("probes/digest.py", "pytest_workerstart.session"),      # a probe importing the session
    ("harness/reaper.py", "pytest_workerstart.checkenv"),    # the harness importing the checks' support
    ("probes/leaks.py", "pytest_workerstart.harness.reaper"),  # a probe that acts
    ("reference/loader.py", "pytest_workerstart.probes.leaks"),  # the product importing what judges it
])
def test_an_upward_import_breaks_them(copy, module, upward):
    with open(copy / "pytest_workerstart" / module, "a") as f:
        f.write(f"\nimport {upward}  # noqa: E402\n")
    proc = _lint(copy)
    assert proc.returncode == 1 and "BROKEN" in proc.stdout, proc.stdout[-3000:]
    assert f"pytest_workerstart.{module.removesuffix('.py').replace('/', '.')} -> {upward}" in proc.stdout


def test_no_import_is_excused():
    """The contracts hold without exceptions: an ``ignore_imports`` list would hide an arrow."""
    assert "ignore_imports" not in (ROOT / "pyproject.toml").read_text()
