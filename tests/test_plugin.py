"""The plugin's interface: inertness, option precedence, bad input, verdict."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_workerstart.protocol import CAPABILITIES
from tests._interruptible import PYTEST

FAST = ("--workerstart-context=forkserver", "-p", "no:cacheprovider")
#: where the subject is what a run says, not the points it judges: no explored cases to wait for
QUICK = "--workerstart-profile=quick"


@pytest.mark.cold_pytest  # what the run imports is the subject
def test_inert_without_the_flag(pytester):
    pytester.makepyfile(
        """
        import sys

        def test_plain(request):
            assert request.config.pluginmanager.has_plugin("workerstart")
            assert "torch" not in sys.modules
            assert "numpy" not in sys.modules
            # the plugin, its settings and the public fixtures with the probes they use: nothing that runs a suite
            loaded = {m for m in sys.modules if m.startswith("pytest_workerstart.")}
            assert "pytest_workerstart.fixtures.public" in loaded
            assert not loaded & {"pytest_workerstart.session", "pytest_workerstart.checkenv",
                                 "pytest_workerstart.parity", "pytest_workerstart.explore",
                                 "pytest_workerstart.datasets", "pytest_workerstart.reference"}
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not [ln for ln in result.stdout.lines if ln.startswith("workerstart")], result.stdout.str()


def _usage_error(pytester, *args, env=None):
    if env:
        for k, v in env.items():
            pytester._monkeypatch.setenv(k, v)
    result = pytester.runpytest_subprocess("--workerstart", *args)
    err = result.stderr.str()
    assert result.ret == 4, f"exit {result.ret}\n{result.stdout.str()[-1500:]}\n{err[-1500:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Traceback" not in result.stdout.str()
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--workerstart-loader=nosuch"], "unknown built-in loader 'nosuch'"),
    (["--workerstart-loader=no_such_module_xyz:Loader"], "no module named 'no_such_module_xyz'"),
    (["--workerstart-loader=os:no_such_attr"], "has no attribute 'no_such_attr'"),
    (["--workerstart-loader=os:sep"], "is a str, not a callable"),
    (["--workerstart-loader=a b:c"], "malformed loader SPEC"),
    (["--workerstart-loader=mod:"], "malformed loader SPEC"),
    (["--workerstart-loader=torch", "--workerstart-parallelism-kwarg=bogus"],
     "does not accept the parallelism keyword 'bogus'"),
    (["--workerstart-context=spawn,threads"], "unknown context 'threads'"),
    (["--workerstart-json=/no/such/dir/v.json"], "does not exist"),
    (["--workerstart-capability=teleport=true"], "unknown capability 'teleport'"),
])
def test_bad_input_is_a_usage_error(pytester, args, message):
    line = _usage_error(pytester, *args)
    assert message in line, line


def test_unwritable_json_path(pytester):
    d = pytester.mkdir("ro")
    os.chmod(d, 0o500)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        assert "not writable" in _usage_error(pytester, f"--workerstart-json={d}/v.json")
    finally:
        os.chmod(d, 0o700)


def test_json_path_that_is_a_directory(pytester):
    d = pytester.mkdir("adir")
    assert "is a directory" in _usage_error(pytester, f"--workerstart-json={d}")


def _header_loader(pytester, *args):
    result = pytester.runpytest_subprocess("--workerstart", "--collect-only", *FAST, *args)
    m = re.search(r"workerstart: loader (\S+) =", result.stdout.str())
    assert m, result.stdout.str()[-2000:]
    return m.group(1)


def test_loader_precedence(pytester, monkeypatch):
    monkeypatch.delenv("WORKERSTART_LOADER", raising=False)
    assert _header_loader(pytester) == "reference"
    pytester.makeini("[pytest]\nworkerstart_loader = torch\n")
    assert _header_loader(pytester) == "torch"
    monkeypatch.setenv("WORKERSTART_LOADER", "torchdata")
    assert _header_loader(pytester) == "torchdata"
    assert _header_loader(pytester, "--workerstart-loader=reference") == "reference"


def test_collects_suite_alongside_given_paths(pytester):
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest_subprocess("--workerstart", "--collect-only", "-q", *FAST, "test_mine.py")
    out = result.stdout.str()
    assert "test_mine.py::test_mine" in out
    assert "start.default_serial-forkserver" in out
    alone = pytester.runpytest_subprocess("--workerstart", "--collect-only", "-q", *FAST).stdout.str()
    assert "test_mine" not in alone and "start.default_serial-forkserver" in alone


def test_verdict_json_schema_and_summary(run_suite):
    v = run_suite(*FAST, "-k", "start.default_serial or start.parameter_validation or start.respects_bound",
                  "--workerstart-loader=torch")
    data = v.data
    assert set(data) >= {"loader", "machine", "checks", "summary"}
    assert data["loader"]["spec"] == "torch" and data["loader"]["qualified_name"].endswith("DataLoader")
    assert data["loader"]["version"].startswith("2.")
    assert set(data["machine"]) >= {"python", "torch", "cpu_count", "platform"}
    for c in data["checks"]:
        assert set(c) >= {"id", "context", "outcome", "reason", "duration_s"}
        assert re.fullmatch(r"[a-z_]+\.[a-z_]+", c["id"])
        assert c["outcome"] in ("passed", "failed", "skipped", "xfailed", "error")
        assert c["context"] == "forkserver"
    assert v.outcomes("start.default_serial") == ["passed"]
    # stock torch has no parallelism keyword: skipped, with the capability named
    assert set(v.outcomes("start.respects_bound")) == {"skipped"}
    assert all("parallel_start" in r for r in v.reasons("start.respects_bound"))
    counts = {o: sum(c["outcome"] == o for c in data["checks"]) for o in data["summary"]}
    assert counts == data["summary"]
    out = v.result.stdout.str()
    line = next(ln for ln in out.splitlines() if ln.startswith("workerstart: ") and " passed, " in ln)
    assert line == "workerstart: " + ", ".join(f"{data['summary'][o]} {o}" for o in
                                               ("passed", "failed", "skipped", "xfailed", "error"))
    assert "skipped 9x: loader does not declare capability 'parallel_start' for context 'forkserver'" in out \
        or "loader does not declare capability 'parallel_start'" in out


def test_third_party_class_with_zero_code(run_suite):
    # the quick profile: no explored points (torchdata's shuffled order is its own, and a drawn
    # shuffled point would judge that, not the zero-code path)
    v = run_suite(*FAST, "-k", "start.default_serial or order.registration", "--workerstart-profile=quick",
                  "--workerstart-loader=torchdata.stateful_dataloader:StatefulDataLoader")
    assert v.data["loader"]["qualified_name"].endswith("StatefulDataLoader")
    assert v.outcomes("start.default_serial") == ["passed"]
    # its case and its default corner pass; the full profile's corners are skipped
    assert "passed" in v.outcomes("order.registration") and set(v.outcomes("order.registration")) <= {
        "passed", "skipped"}


def test_user_module_class(pytester, run_suite):
    pytester.makepyfile(myloader="""
        from torch.utils.data import DataLoader

        class MyLoader(DataLoader):
            pass
    """)
    v = run_suite(*FAST, "-k", "start.default_serial", "--workerstart-loader=myloader:MyLoader")
    assert v.outcomes("start.default_serial") == ["passed"]


@pytest.mark.timeout(600)
def test_a_loader_whose_iter_is_a_generator_is_killed_mid_start(pytester, run_suite):
    """accelerate's and mosaic's ``__iter__`` are generators: their workers start at the first
    ``next()``. The driver-death scenario must reach its kill point with them too, or a correct
    loader fails for the suite's own reason ("did not reach the kill point")."""
    pytester.makepyfile(lazyloader="""
        from pytest_workerstart.reference import ParallelStartDataLoader

        class LazyIter(ParallelStartDataLoader):
            def __iter__(self):
                yield from super().__iter__()
    """)
    v = run_suite("--workerstart-context=forkserver", "--workerstart-profile=quick", "-k", "driver_killed",
                  "--workerstart-loader=lazyloader:LazyIter")
    judged = [c for c in v.data["checks"] if c["outcome"] != "skipped"]  # the quick profile: SIGKILL mid-start
    assert [(c["outcome"], "sigkill-mid_start" in c["nodeid"]) for c in judged] == [("passed", True)], judged


def test_factory_that_raises_fails_the_check_not_the_session(pytester, run_suite):
    pytester.makepyfile(badfactory="""
        def make(dataset, **kwargs):
            raise ValueError("factory exploded")
    """)
    # corners only: an explored case would shrink a failure every point has for its whole budget
    v = run_suite(*FAST, "-k", "start.default_serial or transfer.shared_memory", "--workerstart-loader=badfactory:make",
                  "--workerstart-preflight=false", "--workerstart-explore=0")
    assert v.result.ret == 1
    assert v.outcomes("start.default_serial") == ["failed"]
    assert any("factory exploded" in r for r in v.reasons("start.default_serial"))
    assert set(v.outcomes("transfer.shared_memory")) == {"failed"}


def test_expected_failures_file(pytester, run_suite):
    xf = pytester.path / "xfail.txt"
    xf.write_text("# stock torch: no parallel start here\n"
                  "start.default_serial[forkserver]: pretend it is known to fail\n"
                  "order.nonexistent: matches nothing\n")
    pytester.makepyfile(serialloader="""
        from torch.utils.data import DataLoader
        def make(dataset, **kwargs):
            raise RuntimeError("broken on purpose")
    """)
    v = run_suite(*FAST, "-k", "start.default_serial", "--workerstart-loader=serialloader:make",
                  f"--workerstart-xfail={xf}", "--workerstart-preflight=false")
    assert v.outcomes("start.default_serial") == ["xfailed"]
    assert "order.nonexistent" in v.result.stdout.str() and "matches no collected check" in v.result.stdout.str()
    xf.write_text("start.default_serial:\n")
    assert "needs a reason" in _usage_error(pytester, f"--workerstart-xfail={xf}")
    # one case of a parametrized check, the others untouched (full profile: three positions)
    xf.write_text("failure.parent_start_error[forkserver-middle]: known for the middle worker only\n")
    v = run_suite(*FAST, "-k", "test_parent_start_error", "--workerstart-loader=serialloader:make",
                  "--workerstart-profile=full", f"--workerstart-xfail={xf}", "--workerstart-preflight=false",
                  "--workerstart-circuit-breaker=0")
    by_case = {c["nodeid"].rsplit("-", 1)[-1].rstrip("]"): c["outcome"] for c in v.data["checks"]}
    assert by_case == {"first": "failed", "middle": "xfailed", "last": "failed"}, by_case


def test_capability_declared_on_the_command_line(run_suite):
    v = run_suite(*FAST, "-k", "persistent.reuse", "--workerstart-loader=torch",
                  "--workerstart-capability=persistent_workers=false", "--workerstart-preflight=false")
    assert set(v.outcomes("persistent.reuse")) == {"skipped"}
    assert all("persistent_workers" in r for r in v.reasons("persistent.reuse"))


def test_capability_names_are_documented():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "contract.md").read_text()
    for name in CAPABILITIES:
        assert f"`{name}`" in docs, f"capability {name} is not documented"


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # exited (a zombie has no command line) since it was seen
        return []


@pytest.mark.suite  # a pytest of its own, interrupted
def test_sigint_leaves_no_process(tmp_path):
    """A real Ctrl-C while a scenario runs: pytest exits and leaves nothing behind."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*PYTEST, "--workerstart", "-p", "no:cacheprovider",
                             "--workerstart-context=forkserver", "-k", "driver_killed", "-s"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    me = psutil.Process(proc.pid)
    seen = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            for p in me.children(recursive=True):
                seen[p] = p  # a psutil.Process hashes by pid and start since boot
        except psutil.Error:
            break
        if any("scenario" in " ".join(_cmdline(p)) for p in seen.values() if p.is_running()):
            if sum(1 for p in seen.values() if p.is_running()) >= 4:
                break
        time.sleep(0.2)
    assert seen, "pytest started no process"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    gone, alive = psutil.wait_procs(list(seen.values()), timeout=20)
    survivors = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in survivors:
        p.kill()
    assert not survivors, f"left behind after SIGINT: {[(p.pid, p.cmdline()) for p in survivors]}\n{out[-2000:]}"
    assert proc.returncode in (2, 130, -2), out[-2000:]


def test_factory_that_raises_stops_at_the_preflight(pytester, run_suite):
    pytester.makepyfile(badfactory="""
        def make(dataset, **kwargs):
            raise ValueError("factory exploded")
    """)
    v = run_suite(*FAST, "-k", "start.default_serial or transfer.shared_memory", "--workerstart-loader=badfactory:make")
    assert v.result.ret == 4
    assert all(c["state"] == "not_run" and "ValueError: factory exploded" in c["reason"] for c in v.data["checks"])
    assert "workerstart: preflight: loader badfactory:make" in v.result.stdout.str()


def test_no_parallelism_keyword_is_said_in_one_line(pytester, run_suite):
    pytester.makepyfile(concurrency="""
        from torch.utils.data import DataLoader

        class Loader(DataLoader):
            def __init__(self, *args, start_concurrency=1, **kwargs):
                super().__init__(*args, **kwargs)
    """)
    v = run_suite(*FAST, QUICK, "-k", "start.default_serial or order.registration",
                  "--workerstart-loader=concurrency:Loader")
    out = v.result.stdout.str()
    assert "workerstart: no parallelism keyword found for concurrency:Loader: parallel start was never exercised; " \
           "name it with --workerstart-parallelism-kwarg=NAME" in out, out[-2000:]
    assert v.data["coverage"] == {"forkserver": {"order": "serial", "start": "serial"}}
    named = run_suite(*FAST, QUICK, "-k", "order.registration", "--workerstart-loader=concurrency:Loader",
                      "--workerstart-parallelism-kwarg=start_concurrency")
    assert "no parallelism keyword found" not in named.result.stdout.str()
    assert named.data["coverage"] == {"forkserver": {"order": "parallel"}}


def test_quick_profile_runs_parallel_clauses_where_parallel_start_is_declared(pytester):
    """A spawn-only parallel loader: the quick profile's parallel-path clauses run under spawn."""
    result = pytester.runpytest_subprocess("--workerstart", "--collect-only", "-q", "-p", "no:cacheprovider",
                                           "--workerstart-profile=quick",
                                           "--workerstart-capability=parallel_start=spawn")
    out = result.stdout.str()
    assert "order.registration-spawn" in out and "order.registration-forkserver" not in out, out[-2000:]
    assert "start.default_serial-forkserver" in out  # a serial clause keeps the quick default


def test_a_forwarded_parallelism_keyword_is_not_taken_for_validation(pytester, run_suite):
    """A loader taking **kwargs accepts any keyword name and hands it to torch, whose
    "unexpected keyword argument 'foo'" names foo: neither the preflight nor
    start.parameter_validation may take that for the loader's own validation."""
    pytester.makepyfile(forwards="""
        from torch.utils.data import DataLoader

        class Loader(DataLoader):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
    """)
    args = (*FAST, "-k", "start.parameter_validation", "--workerstart-loader=forwards:Loader",
            "--workerstart-parallelism-kwarg=foo")
    v = run_suite(*args)
    assert v.result.ret == 4
    assert "does not take the parallelism keyword 'foo' but passes it on" in v.result.stdout.str()
    v = run_suite(*args, "--workerstart-preflight=false")
    assert set(v.outcomes("start.parameter_validation")) == {"failed"}
    assert any("it passed it on and a callee refused it" in r for r in v.reasons("start.parameter_validation"))


@pytest.mark.suite  # runs the pytest script
def test_adapter_module_in_the_current_directory_under_the_pytest_script(tmp_path):
    """`pytest` (unlike `python -m pytest`) does not put the current directory on
    sys.path; an adapter SPEC naming ./myadapter.py must still resolve."""
    import os
    import subprocess

    (tmp_path / "myadapter.py").write_text("from torch.utils.data import DataLoader as Loader\n")
    script = os.path.join(os.path.dirname(sys.executable), "pytest")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([script, "--workerstart", "--workerstart-loader=myadapter:Loader", "--collect-only", "-q",
                             "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "tests collected" in result.stdout


def test_baseline_separates_inherited_failures_from_new_ones(pytester, run_suite):
    """--workerstart-baseline=FILE: each failed case says what the baseline got; the
    summary counts shared and new failures; a torch subclass without it gets a hint."""

    base = pytester.path / "baseline.json"
    checks = [{"nodeid": "elsewhere/test_digest.py::test_torch_parity[digest.torch_parity-forkserver-map_shuffled]",
               "id": "digest.torch_parity", "context": "forkserver", "state": "finished", "outcome": "failed"},
              {"nodeid": "elsewhere/test_order.py::test_registration[order.registration-forkserver]",
               "id": "order.registration", "context": "forkserver", "state": "finished", "outcome": "passed"}]
    base.write_text(json.dumps({"loader": {"spec": "torch", "version": "2.14.1"}, "machine": {"torch": "2.14.1"},
                                "settings": {"profile": "full"}, "checks": checks}))
    spec = "--workerstart-loader=pytest_workerstart.fixtures.broken.on_torch:IgnoresShuffle"
    sel = ("-k", "(order.registration or torch_parity and map_shuffled) and not _at", "--workerstart-preflight=false")
    v = run_suite(*FAST, spec, *sel, f"--workerstart-baseline={base}")
    out = v.result.stdout.str()
    assert v.data["baseline"]["same"] == ["digest.torch_parity[forkserver-map_shuffled]"], v.data["baseline"]
    assert v.data["baseline"]["new"] == ["order.registration[forkserver]"]
    assert "1 failure(s) the baseline shares, 1 new in this loader" in out, out[-2000:]
    assert "new in this loader: order.registration[forkserver]" in out
    assert "FAILED order.registration[forkserver] [torch: passed]:" in out
    assert {c["id"]: c["baseline_outcome"] for c in v.data["checks"]} == {
        "digest.torch_parity": "failed", "order.registration": "passed"}
    hinted = run_suite(*FAST, spec, *sel)
    assert "--workerstart-baseline=torch shows which of these failures torch has too" in hinted.result.stdout.str()
    assert hinted.data["baseline"] is None
    assert "no such verdict file" in _usage_error(pytester, f"--workerstart-baseline={pytester.path}/x.json")


def test_shipped_torch_baseline_is_a_full_verdict_of_the_pinned_torch():
    from pytest_workerstart import baseline

    shipped = baseline.load("torch")
    assert shipped.loader["spec"] == "torch" and shipped.profile == "full"
    assert shipped.torch and shipped.torch.startswith("2.14.1")
    assert len(shipped.outcomes) > 50


def test_adapter_declarations_name_the_package_and_silence_the_hint(tmp_path, monkeypatch):
    """``__workerstart_package__`` makes the verdict record the adapted package's version;
    a declared ``parallel_start`` (even empty) is an answer, not a missing keyword."""
    import textwrap

    import torch

    from pytest_workerstart import protocol

    # not pytester: it restores sys.modules after the test, and torch cannot be imported twice
    (tmp_path / "ws_my_adapter.py").write_text(textwrap.dedent("""
        from torch.utils.data import DataLoader

        def make(dataset, **kwargs):
            return DataLoader(dataset, **kwargs)

        make.__workerstart_package__ = "torch"
        make.__workerstart_capabilities__ = {"parallel_start": ()}

        def bad(dataset, **kwargs):
            return DataLoader(dataset, **kwargs)

        bad.__workerstart_package__ = "not a name"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    loader = protocol.resolve("ws_my_adapter:make")
    assert loader.package == "torch" and loader.version == protocol.resolve("torch").version
    assert loader.version.split("+")[0] == torch.__version__.split("+")[0]
    assert loader.label == f"ws_my_adapter.make, torch {loader.version}" and not loader.kwarg_not_found
    assert loader.describe()["package"] == "torch"
    with pytest.raises(protocol.SpecError, match="__workerstart_package__"):
        protocol.resolve("ws_my_adapter:bad")


def test_state_dict_capability_is_detected_from_the_class():
    from pytest_workerstart import protocol

    assert protocol.resolve("torchdata").has("state_dict")
    assert protocol.resolve("reference").has("state_dict")
    assert not protocol.resolve("torch").has("state_dict")
    assert not protocol.resolve("torchdata", capability_overrides={"state_dict": "false"}).has("state_dict")


@pytest.mark.parametrize("top", ["torch", "torchdata", "streaming", "pytest_workerstart", "yaml", "numpy"])
def test_the_version_recorded_is_that_of_the_distribution_providing_the_package(top):
    """Found by name where the distribution is named like the import name (a lookup, not a walk
    over every installed distribution's files), by the files where it is not (mosaicml-streaming
    provides ``streaming``, PyYAML ``yaml``)."""
    from importlib import metadata

    from pytest_workerstart import loader_spec

    assert loader_spec.version_of(top) == metadata.version(metadata.packages_distributions()[top][0])


def test_a_scenario_takes_the_version_its_run_found(monkeypatch):
    from pytest_workerstart import protocol

    loader = protocol.resolve("torch")
    monkeypatch.setattr(protocol, "version_of", lambda top: pytest.fail("looked up again"))
    assert protocol.from_payload(loader.payload()).version == loader.version


def test_no_leaks_marker_reports_a_segment_an_exited_child_left(pytester):
    """The marker's end snapshot cannot attribute a block whose creator has exited; its
    /dev/shm watch can, and unlinks it."""
    pytester.makepyfile(test_leaves='''
import multiprocessing
import time

import pytest


def leave():
    from multiprocessing import resource_tracker, shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")
    time.sleep(0.2)
    seg.close()


@pytest.mark.workerstart_no_leaks
def test_leaves():
    p = multiprocessing.get_context("spawn").Process(target=leave)
    p.start()
    p.join()
    assert p.exitcode == 0
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)  # the marker fails the test at teardown
    result.stdout.fnmatch_lines(["*/dev/shm (left by an exited process, unlinked): psm_*"])
    # only the segment it names: xdist neighbours create and remove their own meanwhile
    named = re.findall(r"unlinked\): (psm_\w+)", result.stdout.str())
    assert named and not [n for n in named if os.path.exists(f"/dev/shm/{n}")], named


def test_one_run_judged_by_two_ids(pytester, run_suite):
    """start.respects_bound[pN] and start.builds_all_before_start judge one run: the second names
    where it was made, and when that run fails, fails too, saying where, without running it again."""
    pytester.makepyfile(failsatthree="""
        from pytest_workerstart.reference import ParallelStartDataLoader

        class FailsAtThree(ParallelStartDataLoader):
            def __init__(self, *args, worker_start_parallelism=None, **kwargs):
                if worker_start_parallelism == 3:
                    raise RuntimeError("no three at once")
                super().__init__(*args, worker_start_parallelism=worker_start_parallelism, **kwargs)
    """)
    select = ("-k", "start.respects_bound or start.builds_all_before_start", "--workerstart-profile=full",
              "--workerstart-context=forkserver", "--workerstart-circuit-breaker=0", "--workerstart-explore=0")
    v = run_suite(*select, "--workerstart-loader=reference", "--workerstart-preflight=false")
    assert v.outcomes("start.respects_bound") == ["passed"] * 4  # p1, p2, p3 and the wide corner
    assert v.outcomes("start.builds_all_before_start") == ["passed"]
    cases = {c["nodeid"]: c for c in v.data["checks"]}
    made = next(n for n in cases if "respects_bound" in n and "p3" in n)
    builds = next(c for n, c in cases.items() if "builds_all" in n)
    assert builds["measurements"]["observed_in"] == made
    v = run_suite(*select, "--workerstart-loader=failsatthree:FailsAtThree", "--workerstart-preflight=false")
    by_case = {c["nodeid"]: c for c in v.data["checks"]}
    assert by_case[made]["outcome"] == "failed" and "no three at once" in by_case[made]["reason"]
    builds = next(c for n, c in by_case.items() if "builds_all" in n)
    assert builds["outcome"] == "failed" and f"failed in {made}" in builds["reason"] \
        and "no three at once" in builds["reason"], builds["reason"]
    # p3 and the wide corner (p = 3 on up to 2 usable cores) fail
    wide_p = by_case[made.replace("-p3]", "-wide]")]["measurements"]["points"][0]["point"]
    want = ["failed", "failed", "passed", "passed"] if ",p=3" in wide_p else ["failed", "passed", "passed", "passed"]
    assert sorted(c["outcome"] for n, c in by_case.items() if "respects_bound" in n) == want


def test_what_exists_before_the_checks_is_frozen_while_they_run(pytester, run_suite):
    """The checks collect garbage after each loader: what the run made before them (torch, the
    collected items) is frozen, so a collection walks only what the checks made."""
    pytester.makepyfile(test_mine="import gc\n\ndef test_frozen():\n    assert gc.get_freeze_count() > 100_000\n")
    v = run_suite("--workerstart-context=fork", "--workerstart-preflight=false", "test_mine.py",
                  "-k", "test_frozen or start.default_serial")
    v.result.assert_outcomes(passed=2)
