import json
import os
import subprocess

import pytest

pytest.register_assert_rewrite("tests._env_guard")  # a plugin of this conftest, imported here first
from tests._env_guard import is_a_check  # noqa: E402

#: _env_guard: each self-test leaves process-global state as it found it (fails the one that does not)
pytest_plugins = ["pytester", "tests._env_guard"]

#: Fixtures that run a suite (a pytest subprocess with --workerstart or an embedded check).
SUITE_FIXTURES = {"pytester", "run_suite"}


def pytest_addoption(parser):
    parser.addoption("--skips-fail", action="store_true",
                     help="a skipped self-test fails the run (CI's speed stage: a speed self-test that was not "
                          "judged, e.g. on a busy machine, proves nothing)")


#: where ``make flake-rate`` puts pytest-randomly (PYTHONPATH): for the self-tests' own order only
FLAKE_PLUGINS = ".flake-plugins"


def pytest_configure(config):
    """In an xdist worker, drop make flake-rate's pytest-randomly from the PYTHONPATH the suites
    it starts inherit: their checks keep their order (pytester clears PYTEST_ADDOPTS).

    Make multiprocessing's temp directory now, in the real TMPDIR: it is made once per process,
    where TMPDIR points then, and kept for the process's life (workers inherit it); made during a
    test (a suite session run in this process makes it) it would lie in that test's own TMPDIR,
    which :func:`_own_tmpdir` removes, and the next test's workers could not open a socket there."""
    import os

    from pytest_workerstart.harness.cleanup import share_temp_dir

    share_temp_dir()

    path = os.environ.get("PYTHONPATH")
    if hasattr(config, "workerinput") and path and FLAKE_PLUGINS in path:
        kept = [p for p in path.split(os.pathsep) if not p.rstrip("/").endswith(FLAKE_PLUGINS)]
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
        if not kept:
            del os.environ["PYTHONPATH"]


def pytest_collection_modifyitems(config, items):
    """Mark what runs a suite, so ``-m "not suite"`` is the fast inner loop (``make check``); then
    order the longest kinds first, so that under xdist the short ones fill the end of the run."""
    for item in items:
        if SUITE_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("suite"):
            item.add_marker(pytest.mark.suite)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("suite") is None))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.config.getoption("--skips-fail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and --skips-fail is set: {reason}"
    return report


@pytest.fixture(autouse=True)
def _own_tmpdir(monkeypatch, request):
    """Every process a self-test starts gets a temp directory that goes with the test.

    Several self-tests kill or crash a suite on purpose (``os._exit`` in a build, a
    segfaulting xdist worker, SIGKILL to a session): multiprocessing's ``pymp-*``
    directory (a forkserver's socket) of such a process is never removed by it, and
    used to pile up in ``/tmp``. Short on purpose: AF_UNIX paths end at 107 bytes,
    and a scenario's own temp directory nests inside this one."""
    import shutil
    import tempfile

    if is_a_check(request):
        yield
        return
    path = tempfile.mkdtemp(prefix="ws-test-")
    monkeypatch.setenv("TMPDIR", path)
    yield
    shutil.rmtree(path, ignore_errors=True)


def validate_verdict(data):
    """Every verdict a self-test reads must match the schema shipped in the package."""
    import jsonschema

    from pytest_workerstart.verdict import load_schema

    jsonschema.validate(data, load_schema())


class Verdict:
    """The JSON verdict of a pytest --workerstart run, indexed by check id."""

    def __init__(self, path, result):
        self.result = result
        self.data = json.loads(path.read_text()) if path.exists() else None
        output = result.stdout.str()[-3000:] if result is not None else ""
        assert self.data is not None, f"no verdict written; output:\n{output}"
        validate_verdict(self.data)

    def outcomes(self, check_id):
        return [c["outcome"] for c in self.data["checks"] if c["id"] == check_id]

    def failed_ids(self):
        return {c["id"] for c in self.data["checks"] if c["outcome"] in ("failed", "error")}

    def reasons(self, check_id):
        return [c["reason"] for c in self.data["checks"] if c["id"] == check_id]


#: hypothesis's pytest plugin imports all of hypothesis when a session ends, used or not (0.75 s of CPU
#: per suite run here, a seventh of a one-check run's); the suite's explorer drives hypothesis itself, so the
#: self-tests' suite runs leave the plugin out, and tests/test_explore.py keeps it where exploring is tested.
NO_HYPOTHESIS_PLUGIN = ("-p", "no:hypothesispytest")


#: a failed scenario case is judged once in the self-tests' suite runs (a test passes its own
#: --workerstart-failure-runs after these where reruns are its subject: tests/test_reruns.py)
ONE_RUN = ("--workerstart-failure-runs=1",)


@pytest.fixture(scope="session", autouse=True)
def _warm_pytest(request):
    """The warm pytest server of this self-test process (tests/_warm.py), started before its first
    test so that it is in the process's tree before and after every test; not in a suite run, nor
    with WORKERSTART_SELFTEST_COLD set (every run a real subprocess, e.g. to compare)."""
    from tests import _warm

    if request.config.getoption("workerstart", False) or os.environ.get("WORKERSTART_SELFTEST_COLD"):
        yield
        return
    _warm.SERVER.start()
    yield
    _warm.SERVER.stop()


@pytest.fixture
def pytester(pytester, request):
    """pytester whose ``python -m pytest`` runs are forked from the warm server (tests/_warm.py);
    a test marked ``cold_pytest`` (its subject is the run's process itself) gets real subprocesses."""
    from tests import _warm

    if request.node.get_closest_marker("cold_pytest") is None:
        real = pytester.popen

        def popen(cmdargs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=pytester.CLOSE_STDIN, **kw):
            if stdin is not pytester.CLOSE_STDIN or kw:
                return real(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
            env = os.environ.copy()  # what pytester gives its subprocesses: this directory on PYTHONPATH
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
            return _warm.popen(cmdargs, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)

        pytester.popen = popen
    return pytester


@pytest.fixture
def run_suite(pytester):
    """Run ``pytest --workerstart`` in a subprocess and return its Verdict."""

    def run(*args, timeout=900):
        out = pytester.path / "verdict.json"
        result = pytester.runpytest_subprocess("--workerstart", f"--workerstart-json={out}", "-p", "no:cacheprovider",
                                               *NO_HYPOTHESIS_PLUGIN, *ONE_RUN, *args, timeout=timeout)
        return Verdict(out, result)

    return run
