"""The soaks (docs/bench/soak.md, docs/bench/api-soak.md): their judgement can say "not flat",
and a short run of each, with a cheap start method, measures what they claim."""

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


@pytest.mark.suite
@pytest.mark.timeout(300)
def test_a_short_soak_of_torch_under_fork_is_flat():
    result = soak.soak("torch", "fork", cycles=6, epochs=2, every=2)
    assert [r["cycle"] for r in result["series"]] == [2, 4, 6, 2]
    assert all(j["flat"] for j in result["judgement"].values()), result["judgement"]


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_check_loader_twice_gives_the_same_verdict_and_leaves_nothing_in_the_caller(tmp_path, capsys):
    out = tmp_path / "api-soak.json"
    rc = api_soak.main(["--loader", "torch", "--runs", "2", "--context", "fork", "--check", "order.registration",
                        "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0 and result["identical"] and result["flat"], result
    assert [r["summary"]["passed"] for r in result["runs"]] == [1, 1]
    assert "Every verdict like the first: **yes**" in capsys.readouterr().out
