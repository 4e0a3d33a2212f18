"""docs/results stays true: the table is the rendering of the committed verdicts,
and the headline verdicts still hold against the installed torch/torchdata."""

from pathlib import Path

import pytest

from pytest_workerstart.results_table import PUBLISHED, published, render

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
VERDICTS = published(RESULTS, "table.md")
THIRD_PARTY = published(RESULTS, "third-party.md")
NEW_CLAUSES = [RESULTS / "new-clauses" / f"{name}.json" for name in ("reference", "torch", "torchdata")]


def test_table_renders_the_committed_verdicts():
    assert (RESULTS / "table.md").read_text() == render(VERDICTS), (
        "regenerate: python -m pytest_workerstart.results_table docs/results/{reference,torch,torchdata}.json"
        " > docs/results/table.md")


def test_third_party_table_renders_the_committed_verdicts():
    assert (RESULTS / "third-party.md").read_text() == render(THIRD_PARTY), (
        "regenerate: python -m pytest_workerstart.results_table --write docs/results")


def test_every_published_verdict_is_recorded():
    assert [p.stem for t in PUBLISHED for p in published(RESULTS, t)] == [n for t in PUBLISHED for n in PUBLISHED[t]]


def test_new_clauses_table_renders_the_committed_verdicts():
    assert (RESULTS / "new-clauses.md").read_text() == render(NEW_CLAUSES), (
        "regenerate: python -m pytest_workerstart.results_table docs/results/new-clauses/{reference,torch,"
        "torchdata}.json > docs/results/new-clauses.md")


def test_third_party_verdicts_are_complete_and_against_torch():
    import json

    for path in THIRD_PARTY:
        data = json.loads(path.read_text())
        assert data["complete"] and data["settings"]["profile"] == "full", path.name
        assert data["baseline"] and data["baseline"]["loader"]["spec"] == "torch", path.name


def test_reference_verdict_is_all_green():
    import json

    data = json.loads((RESULTS / "reference.json").read_text())
    assert data["summary"]["failed"] == 0 and data["summary"]["error"] == 0 and data["summary"]["passed"] > 100


@pytest.mark.parametrize("loader, check, expected", [
    ("torch", "failure.driver_killed", "failed"),
    ("torch", "failure.parent_start_error", "failed"),
    ("reference", "failure.driver_killed", "passed"),
])
def test_headline_verdicts_still_hold(run_suite, loader, check, expected):
    """Live, forkserver, quick profile: the table's key claims against the installed packages."""
    v = run_suite(f"--workerstart-loader={loader}", "--workerstart-context=forkserver",
                  "--workerstart-profile=quick", "--workerstart-preflight=false", "-k", check)
    assert expected in v.outcomes(check), (v.outcomes(check), v.reasons(check))


def test_shipped_torch_baseline_is_the_published_torch_verdict():
    """--workerstart-baseline=torch compares against exactly what docs/results publishes."""
    from pytest_workerstart import baseline

    assert baseline.path_of("torch").read_bytes() == (RESULTS / "torch.json").read_bytes(), (
        "copy docs/results/torch.json to pytest_workerstart/baselines/torch.json")


def test_changes_name_each_case_that_changed_appeared_or_went_away(tmp_path):
    import json

    from pytest_workerstart import results_changes

    def verdict(outcomes, version, started=None, complete=True):
        return {"started": started, "complete": complete, "outcome": "failed", "exitstatus": 1,
                "loader": {"spec": "x:Y", "package": "x", "version": version}, "machine": {"torch": "2.14.1"},
                "plugin_version": "0.3.0", "version": "0.6", "summary": {"passed": 1},
                "checks": [{"nodeid": n, "outcome": o} for n, o in outcomes.items()]}

    old = verdict({"t.py::a[x/y]": "passed", "t.py::b": "failed", "t.py::c": "passed"}, "1.0")
    # the same cases reported from another rootdir: the folder is not part of a case's name
    new = verdict({"conformance/t.py::a[x/y]": "passed", "conformance/t.py::b": "passed",
                   "conformance/t.py::d": "skipped"}, "1.1", "2026-12-04T17:00:00+00:00")
    lines = results_changes.changes(old, new)
    assert "loader x 1.0 -> x 1.1" in lines[0] and "recorded before 0.6 (no date) -> 2026-12-04" in lines[0]
    assert lines[1:] == ["  1 cases as before, 1 changed, 1 new, 1 gone", "  t.py::b: failed -> passed",
                         "  new t.py::d: skipped", "  gone t.py::c (was passed)"]
    (tmp_path / "old").mkdir(), (tmp_path / "new").mkdir()
    (tmp_path / "old" / "x.json").write_text(json.dumps(old))
    (tmp_path / "new" / "x.json").write_text(json.dumps(new))
    (tmp_path / "new" / "y.json").write_text(json.dumps(verdict({"a": "passed"}, "2.0", complete=False)))
    assert results_changes.main([str(tmp_path / "old"), str(tmp_path / "new")]) == 1  # y did not complete
    assert results_changes.compare(tmp_path / "old", tmp_path / "new")[-1] == (
        "x:Y: INCOMPLETE (outcome failed, exit status 1): first recording (1 passed)")
