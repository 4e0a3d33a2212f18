"""Reports ready to file upstream (docs/results/upstream/): each has its sections and a standalone
reproducer that exits 1 on the affected release and 0 on the baseline it compares with, and
docs/results.md links each."""

import ast
import importlib.util
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "results"
UPSTREAM = DOCS / "upstream"
REPORTS = sorted(UPSTREAM.glob("*.md"))
SECTIONS = ("## Versions", "## Reproducer", "## Expected", "## Actual", "## Related")
#: script -> (the project it reports on, as imported; its affected release; argv that fails; argv of the baseline)
SCRIPTS = {
    "accelerate_prefetch_lookahead.py": ("accelerate", "1.16.0", ["fork"], ["fork", "torch.utils.data:DataLoader"]),
    "accelerate_state_dict_without_stateful.py": ("accelerate", "1.16.0", [],
                                                  ["torchdata.stateful_dataloader:StatefulDataLoader"]),
    "accelerate_dispatcher_unbatched.py": ("accelerate", "1.16.0", [], ["torch.utils.data:DataLoader"]),
    "monai_thread_dataloader_swallows_errors.py": ("monai", "1.6.1", ["fork"], ["fork", "monai.data:DataLoader"]),
    "monai_batch_size_none_collate.py": ("monai", "1.6.1", ["fork"], ["fork", "torch.utils.data:DataLoader"]),
    "mosaic_streaming_unbatched.py": ("streaming", "0.13.0", [], ["torch.utils.data:DataLoader"]),
    "torchdata_shuffle_depends_on_workers.py": ("torchdata", "0.11.0", ["fork"],
                                                ["fork", "torch.utils.data:DataLoader"]),
}


def _linked_script(report: Path) -> Path:
    links = re.findall(r"\]\(([^)]+\.py)\)", report.read_text())
    assert links, f"{report.name}: no reproducer linked"
    return (report.parent / links[0]).resolve()


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.stem)
def test_each_report_has_its_sections_a_reproducer_and_a_link_from_results(report):
    text = report.read_text()
    assert text.startswith("# ") and all(s in text for s in SECTIONS), report.name
    assert _linked_script(report).is_file(), report.name
    assert f"results/upstream/{report.name}" in (DOCS.parent / "results.md").read_text(), report.name


def test_every_script_here_is_a_reports_reproducer_and_has_a_case():
    scripts = {p.name for p in UPSTREAM.glob("*.py")}
    assert scripts == {_linked_script(r).name for r in REPORTS if _linked_script(r).parent == UPSTREAM}
    assert scripts == set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_needs_only_the_standard_library_torch_and_the_reported_project(script):
    project = SCRIPTS[script][0]
    modules = set()
    for node in ast.walk(ast.parse((UPSTREAM / script).read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules - set(sys.stdlib_module_names) <= {"torch", project}, modules


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_fails_on_the_affected_release_and_passes_on_the_baseline(script, tmp_path):
    project, affected, failing, passing = SCRIPTS[script]
    if importlib.util.find_spec(project) is None:  # not imported here: monai's import sets environment variables
        pytest.skip(f"{project} is not installed")
    # the import name is not always the distribution's: streaming ships as mosaicml-streaming
    version = metadata.version(metadata.packages_distributions().get(project, [project])[0])
    if version != affected:
        pytest.skip(f"{project} {version} installed; the report is about {affected}")
    for argv, rc in ((failing, 1), (passing, 0)):
        proc = subprocess.run([sys.executable, str(UPSTREAM / script), *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == rc, (argv, proc.stdout[-2000:] + proc.stderr[-2000:])
