"""The suite's time-to-verdict table, rendered from a recorded result (no suite run)."""

from pytest_workerstart.bench import suite


def _result():
    cases = [{"id": "speed.startup", "context": "spawn", "outcome": "passed", "duration_s": 90.0},
             {"id": "failure.child_hang_during_start", "context": "forkserver", "outcome": "failed",
              "duration_s": 20.0},
             {"id": "order.registration", "context": "forkserver", "outcome": "passed", "duration_s": 3.0},
             {"id": "order.registration", "context": "spawn", "outcome": "skipped", "duration_s": 0.0}]
    run = {"loader": "torch", "loader_name": "torch (torch.utils.data.dataloader.DataLoader 2.14.1)",
           "profile": "full", "contexts": ["forkserver", "spawn"], "command": "pytest --workerstart",
           "exitstatus": 1, "complete": True, "wall_s": 150.0, "cpu_s": 200.0, "checks_s": 113.0, "cases": cases}
    return {"label": "2-core VM", "machine": {"cores": 2, "python": "3.11.7", "when": "2026-12-03 12:00"},
            "runs": [run]}


def test_a_row_per_run_and_where_its_time_went():
    text = suite.table(_result())
    assert ("| torch (torch.utils.data.dataloader.DataLoader 2.14.1) | full | forkserver, spawn | 150 | 200 | 113 "
            "| 37 | 2 / 1 / 1 |") in text
    assert "| speed | speed trials, each a fresh driver | 0 | 90 | 90 |" in text
    assert "| order | in-process checks (worker boots, bounded waits) | 3 | 0 | 3 |" in text
    assert text.index("| speed |") < text.index("| failure |") < text.index("| order |")  # slowest first
    assert "Slowest ids: `speed.startup` 90 s, `failure.child_hang_during_start` 20 s" in text


def test_the_command_line_renders_recorded_json(tmp_path, capsys):
    import json

    from pytest_workerstart.bench.__main__ import main

    path = tmp_path / "suite.json"
    path.write_text(json.dumps(_result()))
    assert main(["suite-table", str(path)]) == 0
    assert "### torch (torch.utils.data.dataloader.DataLoader 2.14.1), full profile" in capsys.readouterr().out
    assert main(["suite-table"]) == 2
