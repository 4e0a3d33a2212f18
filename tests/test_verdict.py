"""The verdict file says only what happened, and the settings are resolved once.

Every verdict read here is validated against the package's JSON Schema (see
``tests/conftest.py``).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import Verdict, validate_verdict

FAST = ("--workerstart-context=forkserver", "-p", "no:cacheprovider")
#: for the runs whose subject is the verdict file, not the loader (the preflight has its own tests)
NO_PREFLIGHT = "--workerstart-preflight=false"


def _usage_error(pytester, *args):
    result = pytester.runpytest_subprocess("--workerstart", "--collect-only", *args)
    err = result.stderr.str()
    assert result.ret == 4, f"exit {result.ret}\n{result.stdout.str()[-1500:]}\n{err[-1500:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1 and "Traceback" not in err + result.stdout.str(), err
    return lines[0]


@pytest.mark.parametrize("ini, message", [
    ("workerstart_driver_death_timeout = abc", "ini workerstart_driver_death_timeout"),
    ("workerstart_min_speedup = -3", "expected a positive finite number"),
    ("workerstart_profile = fast", "expected one of quick, full"),
    ("workerstart_context = spawn,threads", "unknown context 'threads'"),
    ("workerstart_strict = maybe", "ini workerstart_strict"),
])
def test_bad_ini_value_is_one_usage_error(pytester, ini, message):
    pytester.makeini(f"[pytest]\n{ini}\n")
    line = _usage_error(pytester)
    assert message in line and "ini workerstart_" in line, line


@pytest.mark.parametrize("args, source", [
    (["--workerstart-min-speedup=-3"], "--workerstart-min-speedup"),
    (["--workerstart-min-speedup=nan"], "--workerstart-min-speedup"),
    (["--workerstart-driver-death-timeout=0"], "--workerstart-driver-death-timeout"),
])
def test_bad_cli_value_names_the_flag(pytester, args, source):
    assert source in _usage_error(pytester, *args)


def test_bad_env_value_names_the_variable(pytester, monkeypatch):
    monkeypatch.setenv("WORKERSTART_PROFILE", "fast")
    assert "$WORKERSTART_PROFILE" in _usage_error(pytester)


def test_precedence_cli_env_ini_default(run_suite, pytester, monkeypatch):
    pytester.makeini("[pytest]\nworkerstart_driver_death_timeout = 21\nworkerstart_min_speedup = 1.7\n")
    monkeypatch.setenv("WORKERSTART_DRIVER_DEATH_TIMEOUT", "22")
    v = run_suite(*FAST, "-k", "start.default_serial", "--workerstart-driver-death-timeout=23", NO_PREFLIGHT)
    s = v.data["settings"]
    assert s["driver_death_timeout"] == 23
    assert s["sources"]["driver_death_timeout"] == "--workerstart-driver-death-timeout"
    assert s["min_speedup"] == 1.7 and s["sources"]["min_speedup"].startswith("ini workerstart_min_speedup")
    assert s["profile"] == "full" and s["sources"]["profile"] == "default"
    assert s["contexts_requested"] == ["forkserver"] and s["contexts_run"] == ["forkserver"]
    assert s["parallelism_kwarg"] == "worker_start_parallelism"


def test_spawn_only_checks_in_a_forkserver_run_write_a_verdict(run_suite):
    """Parametrized checks with no context left used to give pytest's NOTSET (no JSON at all)."""
    v = run_suite(*FAST, "-k", "speed or start.default_serial", NO_PREFLIGHT)
    assert v.result.ret == 0, v.result.stdout.str()[-2000:]
    assert v.data["complete"] is True and v.data["outcome"] == "passed"
    speed = [c for c in v.data["checks"] if c["id"].startswith("speed.")]
    assert speed and all(c["outcome"] == "skipped" and "runs only in spawn" in c["reason"] for c in speed)
    assert v.data["settings"]["contexts_run"] == ["forkserver"]
    assert {d["id"] for d in v.data["deselected"]} >= {"leaks.clean_exit", "digest.first_batch"}


def test_interrupted_run_claims_nothing_it_did_not_finish(run_suite, pytester):
    """A KeyboardInterrupt inside a check: that check and the rest have no outcome."""
    pytester.makepyfile(interrupting="""
        import os
        from torch.utils.data import DataLoader

        def make(dataset, **kwargs):
            mark = f"calls-{os.getpid()}"  # the preflight runs in another interpreter
            if os.path.exists(mark):
                raise KeyboardInterrupt
            open(mark, "w").close()
            return DataLoader(dataset, **kwargs)
    """)
    v = run_suite(*FAST, "-k", "start.default_serial or leaks.clean_exit", "--workerstart-loader=interrupting:make",
                  NO_PREFLIGHT)
    data = v.data
    assert v.result.ret == 2 and data["exitstatus"] == 2
    assert data["complete"] is False and data["outcome"] == "incomplete"
    states = [c["state"] for c in data["checks"]]
    assert states.count("finished") == 1 and "running" in states and "not_run" in states, data["checks"]
    for c in data["checks"]:
        if c["state"] != "finished":
            assert c["outcome"] is None and c["reason"], c
    assert data["summary"]["passed"] == 1 and data["summary"]["not_run"] == len(states) - 1
    assert "INCOMPLETE" in v.result.stdout.str()


def test_a_crashed_pytest_leaves_the_last_consistent_verdict(pytester):
    """The file is rewritten as each check finishes: a driver killed by the loader
    (here os._exit in the second build) leaves finished checks and complete: false,
    and the guard marks the check that was running as the one pytest died in."""
    pytester.makepyfile(crashing="""
        import os
        from torch.utils.data import DataLoader

        def make(dataset, **kwargs):
            mark = f"calls-{os.getpid()}"  # the preflight runs in another interpreter
            if os.path.exists(mark):
                os._exit(139)
            open(mark, "w").close()
            return DataLoader(dataset, **kwargs)
    """)
    out = pytester.path / "verdict.json"
    env = {**os.environ, "PYTHONPATH": str(pytester.path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--workerstart", *FAST, f"--workerstart-json={out}",
                           "-k", "start.default_serial or leaks.clean_exit", "--workerstart-loader=crashing:make"],
                          cwd=pytester.path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 139, proc.stdout[-2000:]
    deadline = time.monotonic() + 20
    while json.loads(out.read_text())["outcome"] == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    data = json.loads(out.read_text())
    validate_verdict(data)
    assert data["complete"] is False and data["outcome"] == "incomplete" and data["exitstatus"] is None
    finished = [c for c in data["checks"] if c["state"] == "finished"]
    assert [c["outcome"] for c in finished] == ["passed", "error"], data["checks"]
    assert "pytest died while this check ran" in finished[1]["reason"]
    assert all(c["outcome"] is None and "pytest died during" in c["reason"]
               for c in data["checks"] if c["state"] != "finished")


def test_verdict_of_a_plain_run_validates(run_suite):
    v = run_suite(*FAST, "-k", "start.default_serial", "--workerstart-loader=torch")
    assert isinstance(v, Verdict) and v.data["version"] == "0.6" and v.data["plugin_version"]
    import datetime

    started = datetime.datetime.fromisoformat(v.data["started"])  # when the run began, UTC
    assert started.utcoffset() == datetime.timedelta(0)
    assert 0 <= (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() < 900


def test_every_check_lists_the_points_it_judged(run_suite):
    """In-process builds, a run shared by two ids, a scenario process's builds and those of a
    driver killed on purpose all reach the verdict's points; the terminal has a line per clause."""
    ids = {"start.default_serial", "order.registration", "order.worker_seeds", "exit.clean_interpreter",
           "failure.driver_killed"}
    v = run_suite("--workerstart-context=fork", "--workerstart-profile=quick", "--workerstart-loader=reference",
                  "-k", " or ".join(sorted(ids)))
    points = v.data["points"]
    passed = {c["id"] for c in v.data["checks"] if c["outcome"] == "passed"}
    assert passed == ids, v.data["checks"]
    assert set(points) == passed, points
    assert all(p["origin"] in ("fixed", "corner") and p["contexts"] == ["fork"] for ps in points.values() for p in ps)
    assert "N=3,p=none,data=map,len=8,batch=2" in points["start.default_serial"][0]["point"]
    # order.registration judges the run order.worker_seeds made (or the other way round): the same points
    shared = {p["point"] for p in points["order.registration"]} & {p["point"] for p in points["order.worker_seeds"]}
    assert shared, points
    assert any(line.startswith("workerstart: points exit: ") for line in v.result.outlines), v.result.outlines[-20:]


def test_every_option_is_documented():
    """docs/usage.md lists each option's flag, environment variable and ini key."""
    from pathlib import Path

    from pytest_workerstart.settings import OPTIONS

    text = (Path(__file__).resolve().parent.parent / "docs" / "usage.md").read_text()
    for opt in OPTIONS:
        for name in (opt.flag, opt.env_name, opt.ini_name):
            if name:
                assert f"`{name}" in text, f"{name} ({opt.field}) is not in docs/usage.md"


def test_help_lists_every_option(pytester):
    from pytest_workerstart.settings import OPTIONS

    out = pytester.runpytest_subprocess("--help").stdout.str()
    for opt in OPTIONS:
        assert opt.flag in out, opt.flag


def test_a_reason_keeps_the_workers_original_exception():
    """torch re-raises a worker's error as "Caught X in DataLoader worker process N.";
    the reason must carry the original type and message, not just that line."""
    import types

    from pytest_workerstart.verdict import one_line

    message = ("TypeError: Caught TypeError in DataLoader worker process 0.\n"
               "Original Traceback (most recent call last):\n"
               '  File "worker.py", line 349, in _worker_loop\n    data = fetcher.fetch(index)\n'
               "TypeError: 'NoneType' object is not subscriptable\n")
    report = types.SimpleNamespace(longrepr=types.SimpleNamespace(reprcrash=types.SimpleNamespace(message=message)))
    assert one_line(report) == ("TypeError: Caught TypeError in DataLoader worker process 0. "
                                "(in the worker: TypeError: 'NoneType' object is not subscriptable)")
    plain = types.SimpleNamespace(longrepr=types.SimpleNamespace(reprcrash=types.SimpleNamespace(message="boom\nmore")))
    assert one_line(plain) == "boom"


def test_junit_xml_and_the_github_step_summary_carry_the_verdict(run_suite, pytester, monkeypatch):
    """CI conventions: each case's check id, context and measurements as junit properties, and
    under GitHub Actions the verdict's table appended to $GITHUB_STEP_SUMMARY."""
    import xml.etree.ElementTree as ET

    summary = pytester.path / "step-summary.md"
    summary.write_text("earlier steps\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = pytester.path / "junit.xml"
    v = run_suite("--workerstart-context=forkserver", "--workerstart-profile=quick", "-k", "start.respects_bound",
                  f"--junitxml={junit}", NO_PREFLIGHT)
    assert "passed" in v.outcomes("start.respects_bound")
    passed = next(c for c in v.data["checks"] if c["outcome"] == "passed")
    case = next(tc for tc in ET.parse(junit).iter("testcase") if tc.get("name") in passed["nodeid"])
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["workerstart_check"] == "start.respects_bound" and props["workerstart_context"] == "forkserver", props
    # one property per measurement, its value JSON
    measured = {k.partition(".")[2]: json.loads(v) for k, v in props.items()
                if k.startswith("workerstart_measurements")}
    assert measured == passed["measurements"] and measured, (measured, passed)
    assert "workerstart_measurements" not in props, props
    text = summary.read_text()
    assert text.startswith("earlier steps\n") and "## workerstart verdict: `reference`" in text, text
    assert "| `start.respects_bound` |" in text and "passed" in text, text
