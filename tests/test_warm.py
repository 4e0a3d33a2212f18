"""The warm pytest server (tests/_warm.py): a forked run is the run a fresh ``python -m pytest``
would be, as far as the self-tests' runs can tell."""

import json
import subprocess
import sys

import pytest

from tests import _warm

pytestmark = pytest.mark.suite  # runs pytest of its own: not in make check's inner loop

@pytest.fixture(autouse=True)
def _server_ready():
    if _warm.SERVER.proc is None:
        pytest.skip("no warm server in this process (WORKERSTART_SELFTEST_COLD is set)")
    assert _warm.SERVER.wait_ready(_warm.START_TIMEOUT_S), f"the warm server: {_warm.SERVER.describe()}"


#: what a run can see of how it was started
PROBE = """
import json, multiprocessing.spawn, os, sys, tempfile

def test_probe():
    import numpy
    main = sys.modules["__main__"]
    seen = {"cwd": os.getcwd(), "path": sys.path[:3], "argv0": os.path.basename(sys.argv[0]),
            "main": getattr(main.__spec__, "name", None), "tmp": tempfile.gettempdir(),
            "env": os.environ.get("WARM_PROBE"), "stdin": sys.stdin.read(), "spawn_main":
            multiprocessing.spawn.get_preparation_data("x").get("init_main_from_name"),
            "draw": int(numpy.random.randint(1 << 30))}
    with open(os.environ["WARM_PROBE_OUT"], "w") as f:
        json.dump(seen, f)
    print("probe ran")
"""


def _probe(tmp_path, name, popen):
    work = tmp_path / name
    (work / "tmp").mkdir(parents=True)
    (work / "test_probe.py").write_text(PROBE)
    env = {**__import__("os").environ, "WARM_PROBE": name, "WARM_PROBE_OUT": str(work / "seen.json"),
           "TMPDIR": str(work / "tmp"), "PYTHONPATH": str(tmp_path / "extra")}
    with open(work / "out.txt", "w") as out:
        proc = popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "test_probe.py"], cwd=work,
                     env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        code = proc.wait(120)
    seen = json.loads((work / "seen.json").read_text())
    return proc, code, seen, (work / "out.txt").read_text()


def test_a_forked_run_sees_what_a_fresh_interpreter_would(tmp_path):
    cold_proc, cold_code, cold, _ = _probe(tmp_path, "cold", subprocess.Popen)
    warm_proc, warm_code, warm, output = _probe(tmp_path, "warm", _warm.popen)
    assert isinstance(warm_proc, _warm.WarmRun), f"the server did not take the run: {_warm.SERVER.describe()}"
    assert cold_code == warm_code == 0 and "probe ran" in output and "1 passed" in output, output
    draws = cold.pop("draw"), warm.pop("draw")
    assert warm == {**cold, "cwd": cold["cwd"].replace("cold", "warm"), "env": "warm",
                    "path": [p.replace("cold", "warm") for p in cold["path"]],
                    "tmp": cold["tmp"].replace("cold", "warm")}, (cold, warm)
    second = _probe(tmp_path / "again", "warm", _warm.popen)[2]
    assert second["draw"] != draws[1], "numpy's global generator is drawn afresh in each run"


def test_exit_codes_and_a_kill_come_back(tmp_path):
    (tmp_path / "test_fail.py").write_text("def test_fail():\n    assert False\n")
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    assert _warm.run([*cmd, "test_fail.py"], cwd=tmp_path, timeout=120) == 1
    with pytest.raises(subprocess.TimeoutExpired):
        _warm.run([*cmd, "test_hang.py"], cwd=tmp_path, timeout=5)
    assert _warm.run([*cmd, "test_fail.py"], cwd=tmp_path, timeout=120) == 1, "the server serves on after a kill"


def test_a_run_while_the_server_is_busy_is_a_real_subprocess(tmp_path):
    (tmp_path / "test_ok.py").write_text("import time\n\ndef test_ok():\n    time.sleep(2)\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_ok.py"]
    with open(tmp_path / "a.txt", "w") as a, open(tmp_path / "b.txt", "w") as b:
        first = _warm.popen(cmd, cwd=tmp_path, stdout=a, stderr=subprocess.STDOUT)
        second = _warm.popen(cmd, cwd=tmp_path, stdout=b, stderr=subprocess.STDOUT)
        codes = first.wait(120), second.wait(120)  # both ended before judging: neither is left running
    assert isinstance(first, _warm.WarmRun) and isinstance(second, subprocess.Popen), _warm.SERVER.describe()
    assert codes == (0, 0)
