"""The runnable examples in docs/ run, and the docs build with --strict."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _python_blocks(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks("fixtures.md"))))
def test_fixture_examples_run(pytester, index):
    code = _python_blocks("fixtures.md")[index]
    pytester.makepyfile(test_example=code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=len(re.findall(r"^def test_", code, flags=re.M)))


def test_mkdocs_build_strict(tmp_path):
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    root = DOCS.parent
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.suite  # the example judges torch in two checks
@pytest.mark.parametrize("index", range(len(_python_blocks("ci.md"))))
def test_check_loader_example_runs(index, tmp_path):
    proc = subprocess.run([sys.executable, "-c", _python_blocks("ci.md")[index]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "<LoaderVerdict torch: passed (4 passed, 10 skipped)>" in proc.stdout
