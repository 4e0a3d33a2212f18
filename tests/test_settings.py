"""Where the settings decide what this pytest process does."""

import types

import pytest

from pytest_workerstart import settings


@pytest.mark.parametrize(("collect_only", "numprocesses", "worker", "expected"), [
    (False, None, None, True), (True, None, None, False),  # a collection runs nothing
    (False, 2, None, False),  # the xdist controller: its workers run the checks
    (False, 2, "gw0", True),
])
def test_a_process_runs_checks_unless_it_only_collects_or_controls_xdist(monkeypatch, collect_only, numprocesses,
                                                                        worker, expected):
    if worker:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    else:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    config = types.SimpleNamespace(option=types.SimpleNamespace(collectonly=collect_only, numprocesses=numprocesses))
    assert settings.runs_checks(config) is expected
