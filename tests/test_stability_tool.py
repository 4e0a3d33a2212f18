"""tools/stability: recordings of one loader compared case by case (docs/results/stability.md)."""

import json

from tools import stability


def _verdict(outcomes: dict, complete=True, reasons=None) -> dict:
    reasons = reasons or {}
    checks = [{"nodeid": f"conformance/x/{n}", "outcome": o, "reason": reasons.get(n, "")} for n, o in outcomes.items()]
    summary = {k: list(outcomes.values()).count(k) for k in ("passed", "failed", "skipped")}
    return {"complete": complete, "checks": checks, "summary": summary, "duration_s": 12.3}


def test_runs_that_agree_pass_and_unstable_cases_are_listed():
    a = _verdict({"test_x.py::a": "passed", "test_x.py::b": "failed"},
                 reasons={"test_x.py::b": "Failed: unstable: failed 1 of 2: it flipped"})
    lines, agree = stability.report([("q1", a), ("q2", _verdict({"test_x.py::a": "passed", "test_x.py::b": "failed"}))])
    assert agree
    assert "2 of 2 cases have the same outcome in every run; 0 differ." in lines
    assert "- `test_x.py::b`: q1: unstable: failed 1 of 2: it flipped" in lines


def test_a_case_that_differs_or_an_incomplete_run_disagrees(tmp_path):
    a = _verdict({"test_x.py::a": "passed", "test_x.py::b": "passed"})
    b = _verdict({"test_x.py::a": "failed"}, complete=False)
    lines, agree = stability.report([("q1", a), ("q2", b)])
    assert not agree
    assert "| `test_x.py::a` | passed | failed |" in lines and "| `test_x.py::b` | passed | absent |" in lines
    assert any(line.startswith("| q2 (INCOMPLETE) |") for line in lines)
    (tmp_path / "a.json").write_text(json.dumps(a))
    assert stability.main([f"q1={tmp_path / 'a.json'}", f"q1again={tmp_path / 'a.json'}"]) == 0
