"""The soaks (docs/bench/soak.md, docs/bench/api-soak.md): their judgement can say "not flat",
and a short run of each, with a cheap start method, measures what they claim."""

import gc
import json

import pytest

from pytest_workerstart.bench import api_soak, soak

pytestmark = pytest.mark.usefixtures("torch_process_state")


def _rows(fds):
    return [{"phase": "lifecycles", "cycle": 50 * (k + 1), "fds": f, "threads": 3, "children": 0, "zombies": 0,
             "shm_entries": 0, "semaphores": 0, "pss_mib": 300.0} for k, f in enumerate(fds)]


def test_a_resource_that_grows_is_not_flat_and_one_within_its_allowance_is():
    assert not soak.judge(_rows([20, 21, 22, 23]))["lifecycles/fds"]["flat"]
    assert soak.judge(_rows([20, 22, 21, 22]))["lifecycles/fds"]["flat"]
    assert soak.judge(_rows([20, 21, 22, 23]))["lifecycles/fds"]["slope_per_1000"] == 20.0


def _samples(*fds):
    """A measure whose fds take ``fds`` one call after another (then stay at the last)."""
    rows = iter(_rows(list(fds)))
    last = {}

    def measure():
        nonlocal last
        last = next(rows, last)
        return dict(last)

    return measure


def test_a_resource_released_late_is_taken_again_and_one_never_released_stays_over():
    after_warmup = _rows([20])[0]
    late = soak.settled(_samples(25, 24, 20), after_warmup, settle_s=5)
    assert late["fds"] == 20 and late["settle_s"] >= 1.0
    leaked = soak.settled(_samples(25, 26, 25), after_warmup, settle_s=1.2)
    assert leaked["fds"] == 25 and soak.over(leaked, after_warmup) == ["fds"]
    assert soak.settled(_samples(21), after_warmup)["settle_s"] < 0.5  # within its allowance: taken once


@pytest.mark.suite
@pytest.mark.timeout(300)
def test_a_short_soak_of_torch_under_fork_is_flat():
    result = soak.soak("torch", "fork", cycles=6, epochs=2, every=2)
    assert [r["cycle"] for r in result["series"]] == [2, 4, 6, 2]
    grown = {k: j for k, j in result["judgement"].items() if not j["flat"]}
    assert not grown, (grown, [(r["phase"], r["cycle"], r["settle_s"], r["fd_kinds"]) for r in result["series"]])


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_check_loader_twice_gives_the_same_verdict_and_leaves_nothing_in_the_caller(tmp_path, capsys):
    out = tmp_path / "api-soak.json"
    rc = api_soak.main(["--loader", "torch", "--runs", "2", "--context", "fork", "--check", "order.registration",
                        "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0 and result["identical"] and result["flat"], result
    assert [r["summary"]["passed"] for r in result["runs"]] == [2, 2]  # the check's case and its default corner
    assert "Every verdict like the first: **yes**" in capsys.readouterr().out
    assert gc.get_freeze_count() == 0, "the run froze the caller's objects and left them frozen"
