"""Scenario interpreters forked from the zygote (pytest_workerstart/harness/zygote.py)
look, end and fail like the runner's fresh interpreters."""

import json
import os
import signal

import psutil
import pytest

from pytest_workerstart.harness import reaper, runner, zygote
from pytest_workerstart.probes.proc_start import started
from pytest_workerstart.scenarios import child_env


def _run(target, kwargs=None, warm=True, **kw):
    return runner.run_scenario(f"tests._mpprograms:{target}", kwargs or {}, env=child_env(), warm=warm,
                               timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(autouse=True, scope="module")
def _stop_zygote():
    yield
    zygote.shutdown()


def test_a_warm_scenario_is_its_own_session_with_its_own_tmpdir_and_torch_loaded():
    cold, warm = _run("whoami", warm=False), _run("whoami")
    assert cold.status == warm.status == "ok", (cold.details(), warm.details())
    for res in (cold, warm):
        me = res.value
        assert me["sid"] == me["pid"], "a scenario leads its own session"
        assert os.path.basename(me["tmpdir"]) == "tmp" and "workerstart-scenario-" in me["tmpdir"]
        assert me["sigint"] and me["sigchld_default"] and me["stdin"] == os.devnull
    assert warm.value["torch_loaded"] and not cold.value["torch_loaded"], "only the warm one starts with torch"
    # what the zygote imported is frozen: a scenario's gc.collect() does not walk torch's objects
    assert warm.value["gc_frozen"] > 100_000 and cold.value["gc_frozen"] == 0, (warm.value, cold.value)
    assert warm.value["pid"] not in {p.pid for p in psutil.Process().children()}, "forked by the zygote, not by us"


def test_a_warm_scenario_ends_through_the_normal_interpreter_exit():
    res = _run("says_at_exit", {"text": "atexit ran"})
    assert res.status == "ok" and res.returncode == 0
    assert "on stdout" in res.stderr and "atexit ran" in res.stderr, res.stderr


@pytest.mark.parametrize("target, status, code", [("raises", "error", 0), ("exits_hard", "crash", 7)])
def test_warm_failures_read_as_cold_ones(target, status, code):
    cold, warm = _run(target, warm=False), _run(target)
    assert (cold.status, cold.returncode) == (warm.status, warm.returncode) == (status, code)
    assert cold.one_line() == warm.one_line()


def _descendants():
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p)  # hashes by pid and start since boot
        except psutil.Error:
            continue
    return out


def test_a_warm_hang_is_killed_with_its_stacks_and_leaves_nothing():
    _run("returns_42")  # the zygote is up before the count
    before = _descendants()
    res = _run("hang_forever", timeout=3)
    assert res.status == "hang" and "hang_forever" in (res.stacks or ""), res.details()
    assert _descendants() <= before, "the hung scenario outlived its kill"


def test_a_wall_clock_step_during_a_scenario_spares_nothing_of_its_tree(monkeypatch, tmp_path):
    """psutil's create times follow the wall clock (Linux recomputes boot time from it on each
    read): a step of the clock between a scenario's start and its kill (a VM's clock set on
    resume) must not make the reaper take the scenario's own tree for another's and spare it."""
    from psutil import _pslinux  # the one place psutil adds the boot time: the step, simulated

    real, step = _pslinux.boot_time, {"s": 0.0}
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + step["s"])
    register = reaper.register_session

    def register_then_step(sid):
        try:
            return register(sid)
        finally:
            step["s"] = 1.0

    monkeypatch.setattr(reaper, "register_session", register_then_step)
    path = tmp_path / "tree.json"
    res = _run("forkserver_tree_then_hang", {"path": str(path)}, timeout=10)
    assert res.status == "hang" and path.exists(), res.details()
    tree = json.loads(path.read_text())
    spared = [pid for pid, start in tree if _running(pid, start)]
    for pid in spared:  # the tree never ends by itself
        os.kill(pid, signal.SIGKILL)
    assert len(tree) >= 2, tree  # the forkserver and its child (and the resource tracker)
    assert spared == [], res.details()


def _running(pid, start):
    try:  # a zombie is dead: its orphan's parent (init) reaps it when it gets to it
        return started(pid) == start and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_refusing_zygote_gives_a_fresh_interpreter(monkeypatch):
    def refuse(env):
        raise zygote.Refused("1 Python thread too many")

    monkeypatch.setattr(zygote, "get", refuse)
    res = _run("whoami")
    assert res.status == "ok" and not res.value["torch_loaded"]


def test_a_directory_pytest_adds_after_the_zygote_started_is_on_the_warm_path(tmp_path, monkeypatch):
    """The zygote may start before pytest adds the project's directories (the plugin starts it
    while pytest imports the suite): each child gets its PYTHONPATH where a fresh interpreter has it."""
    zygote.shutdown()
    first = zygote.get({**os.environ, **child_env()})
    (tmp_path / "added_later_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cold, warm = (_run("path_and_import", {"module": "added_later_mod"}, warm=w) for w in (False, True))
    assert cold.status == warm.status == "ok", (cold.details(), warm.details())
    assert zygote.get({**os.environ, **child_env()}) is first, "a new PYTHONPATH does not replace the zygote"
    assert warm.value["file"] == cold.value["file"] == str(tmp_path / "added_later_mod.py")
    assert warm.value["pythonpath"] == cold.value["pythonpath"]
    assert warm.value["path"] == cold.value["path"], "the same sys.path as a fresh interpreter's"


def test_the_zygote_goes_when_asked_and_with_its_environment():
    first = zygote.get({**os.environ, **child_env()})
    assert zygote.get({**os.environ, **child_env(), "PYTEST_CURRENT_TEST": "another phase"}) is first
    other = zygote.get({**os.environ, **child_env(), "WORKERSTART_SELFTEST_ENV": "1"})
    assert other is not first and first.proc.poll() is not None, "another environment replaces the zygote"
    zygote.shutdown()
    assert other.proc.poll() is not None


def test_a_warm_scenario_exits_as_a_fresh_one_with_a_loader_held_by_a_preloaded_module():
    """What the zygote froze is unfrozen before the child's teardown. Frozen, the loader that
    ``exit.clean_interpreter``'s scenario holds in its (preloaded) module was freed only when module
    globals were already gone, and the reference's shutdown raised in ``__del__`` under fork: a
    failure a fresh interpreter never shows."""
    from pytest_workerstart import protocol, scenarios

    loader = protocol.resolve("reference")
    for warm in (False, True):
        res = scenarios.run(loader, "fork", "pytest_workerstart.conformance.exit.clean_exit:scenario_clean_exit",
                            timeout=120, warm=warm, exit_grace=5.0, ending="persistent", num_workers=2,
                            parallelism=2)
        assert (res.status, res.returncode, res.stderr) == ("ok", 0, ""), (warm, res.details())
