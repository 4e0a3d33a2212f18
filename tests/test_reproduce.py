"""Every failed case carries a command that reruns exactly it, with the same outcome."""

import os
import shlex
import subprocess
import sys

import pytest

from pytest_workerstart import settings
from tests.conftest import Verdict

BROKEN = "pytest_workerstart.fixtures.broken.on_torch"


def test_as_args_gives_every_setting_that_changes_a_case_whatever_its_source():
    defaults = {o.field: o.default for o in settings.OPTIONS}
    given = settings.Settings(**{**defaults, "loader": "torch", "capability": ("timeout=false",), "strict": True,
                                 "exit_timeout": 7.5, "preflight": False, "profile": "quick",
                                 "context": ("spawn",), "circuit_breaker": 0, "json": None})
    assert given.as_args() == ["--workerstart-loader=torch", "--workerstart-capability=timeout=false",
                               "--workerstart-profile=quick", "--workerstart-strict", "--workerstart-exit-timeout=7.5",
                               "--workerstart-preflight=false"]
    assert settings.Settings(**defaults).as_args() == ["--workerstart-loader=reference"]


@pytest.mark.suite
@pytest.mark.timeout(600)
def test_each_reproduce_command_reruns_exactly_its_case(pytester, monkeypatch):
    """Settings from the environment become options of the command; rerun without them, each
    command runs one case, in its context, and it fails again."""
    monkeypatch.setenv("WORKERSTART_PROFILE", "quick")
    monkeypatch.setenv("WORKERSTART_EXIT_TIMEOUT", "6")
    monkeypatch.setenv("WORKERSTART_CONTEXT", "fork")  # one context: a spawn rerun of the epoch ids costs ~30 s
    out = pytester.path / "verdict.json"
    first = pytester.runpytest_subprocess(
        "--workerstart", f"--workerstart-json={out}", "-p", "no:cacheprovider",
        f"--workerstart-loader={BROKEN}:ReplaysFirstEpoch", "-k", "epoch_shuffle or rng_streams or registration",
        timeout=300)
    failed = [c for c in Verdict(out, first).data["checks"] if c["outcome"] in ("failed", "error")]
    assert {c["id"] for c in failed} == {"order.epoch_shuffle", "order.rng_streams"}, first.stdout.str()[-3000:]
    passed = [c for c in Verdict(out, first).data["checks"] if c["outcome"] == "passed"]
    assert passed and all(c["reproduce"] is None for c in passed)
    text = first.stdout.str()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSTART_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for case in failed:
        cmd = case["reproduce"]
        assert f"  reproduce: {cmd}" in text
        assert "--workerstart-profile=quick" in cmd and "--workerstart-exit-timeout=6" in cmd, cmd
        assert case["context"] == "fork" and "--workerstart-context=fork" in cmd, cmd
        again = pytester.path / f"again-{case['id']}.json"
        subprocess.run(shlex.split(cmd) + ["-p", "no:cacheprovider", f"--workerstart-json={again}"],
                       cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        rerun = Verdict(again, None).data["checks"]
        assert [(c["id"], c["context"], c["nodeid"], c["outcome"]) for c in rerun] == [
            (case["id"], case["context"], case["nodeid"], case["outcome"])], (cmd, rerun)
