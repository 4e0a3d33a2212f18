"""``check_loader``: the same session as ``pytest --workerstart``, as a function."""

import json

import pytest

import pytest_workerstart
from pytest_workerstart import api

BROKEN = "pytest_workerstart.fixtures.broken.on_torch"


def test_loader_spec_takes_specs_and_importable_objects_only():
    from pytest_workerstart.fixtures.broken.on_torch import ReplaysFirstEpoch

    assert api.loader_spec("torch") == "torch"
    assert api.loader_spec(ReplaysFirstEpoch) == f"{BROKEN}:ReplaysFirstEpoch"

    class Local:
        pass

    with pytest.raises(ValueError, match="must be importable"):
        api.loader_spec(Local)
    with pytest.raises(TypeError, match="SPEC string or a loader class"):
        api.loader_spec(42)


def test_bad_arguments_say_what_is_accepted():
    with pytest.raises(ValueError, match="unknown check ids \\['order.nope'\\]"):
        api.check_loader("torch", checks=["order.nope"])
    with pytest.raises(TypeError, match="unexpected setting 'stirct'.*strict"):
        api.check_loader("torch", stirct=True)
    assert api._option_args({"strict": True, "exit_timeout": 7, "capability": ["timeout=false"],
                             "preflight": False, "step_timeout": None}) == [
        "--workerstart-strict", "--workerstart-exit-timeout=7", "--workerstart-capability=timeout=false",
        "--workerstart-preflight=false"]


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_same_outcomes_as_the_command_line(run_suite, tmp_path):
    ids = ["order.epoch_shuffle", "order.registration"]
    expected = {"order.epoch_shuffle[fork]": "it replays epoch 1"}
    verdict = pytest_workerstart.check_loader(f"{BROKEN}:ReplaysFirstEpoch", contexts=["fork"], checks=ids,
                                              expected_failures=expected, exit_timeout=6,
                                              json_path=tmp_path / "api.json")
    assert verdict.complete and verdict.returncode == 0, verdict.output[-3000:]
    assert {("order.epoch_shuffle[fork]", "xfailed"), ("order.registration[fork]", "passed")} <= {
        (c.key, c.outcome) for c in verdict.cases}
    assert verdict.to_json() == json.loads((tmp_path / "api.json").read_text())
    assert verdict.to_json()["settings"]["exit_timeout"] == 6.0
    (tmp_path / "xfail.txt").write_text("order.epoch_shuffle[fork]: it replays epoch 1\n")
    cli = run_suite(f"--workerstart-loader={BROKEN}:ReplaysFirstEpoch", "--workerstart-context=fork",
                    "--workerstart-profile=quick", "-k", " or ".join(ids),
                    f"--workerstart-xfail={tmp_path / 'xfail.txt'}", "--workerstart-exit-timeout=6")
    assert sorted((c["id"], c["context"], c["outcome"]) for c in cli.data["checks"]) == sorted(
        (c.id, c.context, c.outcome) for c in verdict.cases)


def test_verdict_accessors_read_the_file():
    case = {"nodeid": "conformance/test_order.py::test_epoch_shuffle[order.epoch_shuffle-fork]",
            "id": "order.epoch_shuffle", "context": "fork", "state": "finished", "outcome": "failed",
            "reason": "Failed: epochs 1 and 2 repeat", "duration_s": 1.0, "baseline_outcome": None,
            "measurements": {"problems": ["epochs 1 and 2 repeat"]}, "reproduce": "pytest --workerstart -k x"}
    passed = {**case, "nodeid": "conformance/test_start.py::test_default_serial[start.default_serial-fork]",
              "id": "start.default_serial", "outcome": "passed", "reason": "", "reproduce": None}
    data = {"outcome": "failed", "complete": True, "loader": {"spec": "mypkg:Loader"}, "checks": [case, passed],
            "summary": {"passed": 1, "failed": 1, "skipped": 0, "xfailed": 0, "error": 0, "not_run": 0}}
    verdict = api.LoaderVerdict(data, "output", 1)
    (failed,) = verdict.failed
    assert failed.key == "order.epoch_shuffle[fork]" and failed.measurements["problems"] and failed.reproduce
    assert verdict.failed_ids() == {"order.epoch_shuffle"}
    assert [c.id for c in verdict.passed] == ["start.default_serial"]
    assert repr(verdict) == "<LoaderVerdict mypkg:Loader: failed (1 passed, 1 failed)>"
    assert verdict.to_json() == data and verdict.to_json() is not data
