"""A non-editable install ships the suite and the fixtures under the plugin's
namespace, registers the entry point, and claims no top-level `fixtures`."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contents(tmp_path):
    # the wheel from the sdist (build's default): a checkout's stale build/ folder, which an
    # in-tree build reuses, could otherwise supply modules the package no longer declares
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("pytest_workerstart-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    suite = {n.removeprefix("pytest_workerstart/conformance/") for n in names
             if n.startswith("pytest_workerstart/conformance/")}
    assert {str(p.relative_to(ROOT / "conformance")) for p in (ROOT / "conformance").rglob("*.py")} <= suite, (
        "conformance/ is not all in the wheel")
    assert "pytest_workerstart/datasets.py" in names
    assert "pytest_workerstart/fixtures/public.py" in names
    assert "pytest_workerstart/fixtures/broken/loaders.py" in names
    assert "pytest_workerstart/verdict.schema.json" in names
    # every subpackage of the source tree is declared in pyproject's package list, so none is left out
    packages = {str(i.relative_to(ROOT)) for i in (ROOT / "pytest_workerstart").rglob("__init__.py")}
    assert packages <= set(names), sorted(packages - set(names))
    tops = {n.split("/")[0] for n in names}
    assert tops == {"pytest_workerstart", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "workerstart = pytest_workerstart.plugin" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_changelog_has_a_section_for_the_version_and_each_earlier_release():
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    sections = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert sections[0] == "Unreleased" and version in sections, sections
    assert sections[1:] == sorted(sections[1:], key=lambda v: tuple(map(int, v.split("."))), reverse=True)
