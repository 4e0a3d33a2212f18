"""The batch harness of the mutation self-tests (tests/_batch.py), without running a suite."""

import ast

from tests import _batch


def _slice(*states):
    return _batch.Slice([{"id": "x.y", "state": s, "outcome": "failed" if s == "finished" else None,
                          "reason": "", "nodeid": "n"} for s in states], "output", complete=False)


def test_a_loader_whose_checks_did_not_finish_is_rerun_alone(monkeypatch, tmp_path):
    """A crash ends the batch: the loaders it cut short are judged again, each alone; the rest keep their slice."""
    calls = []

    def run_batch(directory, entries, args, timeout):
        calls.append((directory.name, sorted(entries)))
        if directory.name == "batch":
            return {"done": _slice("finished"), "crashed": _slice("finished", "running"), "never": _slice()}
        return {name: _slice("finished") for name in entries}

    monkeypatch.setattr(_batch, "run_batch", run_batch)
    entries = {name: ("spec", ["x.y"]) for name in ("done", "crashed", "never")}
    got = _batch.judge(tmp_path, entries, [], timeout=1)
    assert calls == [("batch", ["crashed", "done", "never"]), ("alone-crashed", ["crashed"]),
                     ("alone-never", ["never"])]
    assert all(s.finished() for s in got.values())


def test_a_batch_module_imports_exactly_the_selected_checks():
    source = _batch.module_source("pkg.mod:Loader", ["leaks.clean_exit", "start.default_serial"])
    tree = ast.parse(source)
    imported = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imported == {("pytest_workerstart.conformance.leaks.test_leaks", "test_clean_exit"),
                        ("pytest_workerstart.conformance.start.test_start", "test_default_serial")}
    assert "return 'pkg.mod:Loader'" in source
