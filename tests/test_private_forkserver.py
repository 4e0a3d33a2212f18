"""The reference loader's private forkserver: where workers come from, what it preloads,
its lifecycle (shared, replaced, restarted, gone with the driver), and that the
caller's context still sees every start. Truths come from /proc and psutil, not
from the loader."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import forkserver

import psutil
import pytest

from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.harness.clean_exit import run_clean_exit
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.reference import ParallelStartDataLoader, private_forkserver
from tests import _private_server_programs as programs

# torch DataLoaders run in this process: their SIGCHLD handler and worker pids go with each test
pytestmark = pytest.mark.usefixtures("torch_process_state")


def _pids(loader) -> set[int]:
    return {int(p) for b in loader for p in b["pid"]}


def _parents(loader) -> set[int]:
    """The pids of the processes that forked the workers of one epoch (as each worker saw it)."""
    return {int(p) for b in loader for p in b["ppid"]}


def _ppids(pids) -> set[int]:
    return {psutil.Process(p).ppid() for p in pids}


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


def _gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not left:
            return []
        time.sleep(0.1)
    return left


def test_supported_here():
    assert private_forkserver.unsupported() is None


def test_workers_are_forked_from_the_private_server_with_torch_preloaded():
    private_forkserver.stop()  # a server started by an earlier test would not have this dataset's module
    global_preload = list(forkserver._forkserver._preload_modules)
    loader = programs._loader(n=3, persistent=True)
    server = private_forkserver.current()
    pids = _pids(loader)
    assert len(pids) == 3
    assert _ppids(pids) == {server.pid}, "workers must be children of the loader's own server"
    assert server.pid != getattr(forkserver._forkserver, "_forkserver_pid", None)
    assert _maps_torch(server.pid), "the server must have imported torch before forking workers"
    assert "tests._private_server_programs" in server.preload  # the dataset's module
    assert forkserver._forkserver._preload_modules == global_preload, "multiprocessing's own server was touched"
    del loader


def test_the_callers_instrumented_context_still_sees_every_start():
    ctx = InstrumentedContext("forkserver", num_workers=3)
    loader = ParallelStartDataLoader(WorkerTagDataset(6), batch_size=2, num_workers=3, multiprocessing_context=ctx,
                                     worker_start_parallelism=3, persistent_workers=True)
    pids = _pids(loader)
    recs = ctx.records(0)
    assert [r.worker for r in recs] == [0, 1, 2]
    assert all(r.start_begin and r.start_end and r.boot and r.ready for r in recs), recs
    assert {r.pid for r in recs} == pids
    assert _ppids(pids) == {private_forkserver.current().pid}
    del loader
    ctx.close()


def test_one_server_for_every_loader_and_epoch():
    first = programs._loader()
    server = private_forkserver.current().pid
    assert [_parents(first) for _ in range(2)] == [{server}] * 2
    assert _parents(programs._loader(n=3, p=3)) == {server}
    assert private_forkserver.current().pid == server


def test_opting_out_uses_multiprocessing_forkserver():
    assert _parents(programs._loader(private_forkserver=False)) == {forkserver._forkserver._forkserver_pid}


def test_a_named_preload_missing_from_the_server_replaces_it_once():
    base = programs._loader(persistent=True)
    old = private_forkserver.current().pid
    old_workers = _pids(base)
    named = programs._loader(persistent=True, preload=["json.tool"])
    new = private_forkserver.current()
    assert new.pid != old and "json.tool" in new.preload
    assert set(new.preload) >= {"tests._private_server_programs", "json.tool"}  # the union
    assert _parents(named) == {new.pid}
    assert _ppids(old_workers) == {old}, "the old server serves its workers until they exit"
    del base
    import gc

    gc.collect()
    assert not _gone([old], 10), "the replaced server must exit once its last worker has"
    programs._loader(preload=["json.tool"])
    assert private_forkserver.current().pid == new.pid
    del named


def test_a_killed_server_is_started_again():
    loader = programs._loader()
    old = private_forkserver.current().pid
    assert _parents(loader) == {old}
    os.kill(old, signal.SIGKILL)
    new = _parents(loader)
    assert new == {private_forkserver.current().pid} and old not in new


def test_first_batch_first_later_workers_start_after_the_first_batch():
    ctx = InstrumentedContext("forkserver", num_workers=4)
    loader = ParallelStartDataLoader(WorkerTagDataset(16), batch_size=2, num_workers=4, multiprocessing_context=ctx,
                                     worker_start_parallelism=2)
    it = iter(loader)
    deadline = time.monotonic() + 60
    while not all(r.start_end for r in ctx.records(0)[:2]) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert [r.start_begin is not None for r in ctx.records(0)] == [True, True, False, False]
    got = [int(i) for b in it for i in b["index"]]
    assert got == list(range(16))
    assert all(r.start_end for r in ctx.records(0))
    ctx.close()


def test_gated_workers_start_when_the_first_ones_have_nothing():
    """IterableDataset whose only items are in the shards of gated workers: no deadlock."""
    loader = ParallelStartDataLoader(programs.LastWorkersOnly(first=2), batch_size=None, num_workers=4,
                                     multiprocessing_context="forkserver", worker_start_parallelism=2, timeout=60)
    assert sorted(int(x) for x in loader) == [200, 201, 202, 300, 301, 302]


def test_the_drivers_sys_path_reaches_the_server(tmp_path, monkeypatch):
    """A dataset module found only through a path added at run time is preloaded by the server
    (which imports it once) and not imported again by each worker."""
    (tmp_path / "wsmarker_ds.py").write_text(textwrap.dedent(f"""
        import os
        with open({str(tmp_path / 'imports')!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        from pytest_workerstart.datasets import WorkerTagDataset
        class Marked(WorkerTagDataset):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import wsmarker_ds

    private_forkserver.stop()  # a fresh server: the implicit preload is read when it starts
    loader = ParallelStartDataLoader(wsmarker_ds.Marked(8), batch_size=2, num_workers=2,
                                     multiprocessing_context="forkserver", worker_start_parallelism=2)
    pids = _pids(loader)
    importers = {int(x) for x in (tmp_path / "imports").read_text().split()}
    assert private_forkserver.current().pid in importers
    assert not importers & pids, "workers imported the dataset module again"


def test_the_main_module_is_run_before_the_modules_that_import_it(tmp_path):
    """A script run as ``python -m pkg.driver`` whose dataset module imports ``pkg.driver``: the
    server runs the main module first, as each spawn worker's ``prepare`` does, so ``runpy``
    finds nothing of it imported and says nothing on stderr."""
    pkg = tmp_path / "wsmain_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ds.py").write_text(textwrap.dedent("""
        import wsmain_pkg.driver  # noqa: F401  (the script's module, as a dataset module may import it)
        from pytest_workerstart.datasets import WorkerTagDataset
        class Marked(WorkerTagDataset):
            pass
    """))
    (pkg / "driver.py").write_text(textwrap.dedent("""
        if __name__ == "__main__":
            from pytest_workerstart.reference import ParallelStartDataLoader
            from wsmain_pkg.ds import Marked
            loader = ParallelStartDataLoader(Marked(8), batch_size=2, num_workers=2,
                                             multiprocessing_context="forkserver", worker_start_parallelism=2)
            print(sum(1 for _ in loader))
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    done = subprocess.run([sys.executable, "-m", "wsmain_pkg.driver"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "4", "")


def test_interpreter_exit_is_clean_and_takes_the_server():
    for target in ("one_epoch", "construct_only"):
        res = run_clean_exit(f"tests._private_server_programs:{target}", timeout=120)
        assert res.problems() == [], (target, res.problems())


@pytest.mark.parametrize("program", ["serve_and_wait", "server_only_and_wait"])
def test_driver_killed_takes_server_and_workers(tmp_path, program):
    ready = tmp_path / "ready"
    code = f"import tests._private_server_programs as p; p.{program}({str(ready)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=os.getcwd(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ready.exists(), "the program did not get ready"
        pids = [int(x) for x in ready.read_text().split()]
        proc.kill()
        proc.wait()
        assert not _gone(pids, 15), f"outlived the driver: {pids}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_forked_child_starts_its_own_server():
    # in a fresh interpreter: forking this multi-threaded test process could inherit a lock
    # (the resource tracker's) that another thread held at the fork, which is fork's hazard
    res = run_clean_exit("tests._private_server_programs:fork_then_use", timeout=120)
    assert res.problems() == [] and res.result.value == "child exit 0, parent server kept True, parent epoch ok True", (
        res.problems(), res.result.value)


def test_unsupported_python_falls_back_with_one_warning(monkeypatch):
    from pytest_workerstart.reference import loader as reference

    monkeypatch.setattr(private_forkserver, "unsupported", lambda: "Python 9.9: no private forkserver")
    monkeypatch.setattr(reference, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="Python 9.9"):
        loader = programs._loader()
    assert _parents(loader) == {forkserver._forkserver._forkserver_pid}


@pytest.mark.parametrize("loader, forker", [("reference", "another process"), ("torch", "multiprocessing forkserver")])
def test_the_suite_sees_who_forked_the_workers(run_suite, loader, forker):
    """Under forkserver the suite's checks run on the loader's own server for the reference
    (not multiprocessing's), through the suite's instrumented context, and the verdict says so."""
    ids = ["order.registration", "digest.first_batch", "transfer.shared_memory"]  # torch passes these
    verdict = run_suite(f"--workerstart-loader={loader}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "--workerstart-preflight=false", "-k", " or ".join(ids))
    seen = [c for c in verdict.data["checks"] if c["outcome"] == "passed"]
    assert {c["id"] for c in seen} == set(ids), verdict.result.stdout.str()[-2000:]
    assert all((c.get("measurements") or {}).get("workers_forked_by") == [forker] for c in seen), seen
    verdict.result.stdout.fnmatch_lines([f"workerstart: forkserver workers forked by {forker} (*"])
