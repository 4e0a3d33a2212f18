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
                  "--workerstart-profile=quick", "-k", check)
    assert expected in v.outcomes(check), (v.outcomes(check), v.reasons(check))


def test_shipped_torch_baseline_is_the_published_torch_verdict():
    """--workerstart-baseline=torch compares against exactly what docs/results publishes."""
    from pytest_workerstart import baseline

    assert baseline.path_of("torch").read_bytes() == (RESULTS / "torch.json").read_bytes(), (
        "copy docs/results/torch.json to pytest_workerstart/baselines/torch.json")
