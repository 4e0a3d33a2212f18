"""pytest entry point of pytest-workerstart.

Inert unless ``--workerstart`` is given: this module imports only pytest, the
standard library and :mod:`pytest_workerstart.settings`, registers options,
markers and the public fixtures (whose bodies import the probes lazily), and
nothing else. With ``--workerstart`` it resolves the settings once (see
:mod:`pytest_workerstart.settings` for the precedence) and hands the run to
:mod:`pytest_workerstart.session`.
"""

from __future__ import annotations

import pytest

from pytest_workerstart import settings as _settings


def pytest_addoption(parser: pytest.Parser) -> None:
    _settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers",
                            "workerstart_check(check_id, **requirements): a conformance check with a stable id")
    config.addinivalue_line("markers", "workerstart_scenario(plan): the check's work is the scenario plan(check_env, "
                            "**params) returns; consecutive ones run ahead, --workerstart-scenario-jobs at a time")
    config.addinivalue_line("markers", "workerstart_no_leaks: fail the test if it leaks processes, threads, fds, "
                            "semaphores or shm")
    if config.getoption("workerstart"):
        _start_session(config, embedded=False)


def _start_session(config: pytest.Config, embedded: bool):
    """Resolve the settings once and register the suite's session and check environment."""
    resolved = config.stash[_settings.SETTINGS] = _settings.resolve(config)
    from pytest_workerstart import checkenv
    from pytest_workerstart.session import WorkerstartSession

    session = WorkerstartSession.from_config(config, resolved, embedded=embedded)
    session.register(config.pluginmanager)
    config.pluginmanager.register(checkenv, "workerstart-checkenv")
    return session


def pytest_pycollect_makeitem(collector, name: str, obj) -> None:
    """Checks imported into a project's own tests run without ``--workerstart``.

    The first such check met during collection starts the suite's session
    ("embedded": the suite's own directory is not added), before pytest
    computes the check's fixtures, so that the suite's fixtures exist for it.
    """
    if not any(getattr(m, "name", None) == "workerstart_check" for m in getattr(obj, "pytestmark", ())):
        return None
    config = collector.config
    if config.pluginmanager.has_plugin("workerstart-session"):
        return None
    from pytest_workerstart.harness import reaper

    session = _start_session(config, embedded=True)
    reaper.start_guard(verdict=session.reporter.json_path)  # pytest_sessionstart has already run
    return None


# --- public fixtures ---------------------------------------------------------
# Bodies import lazily so that a plain pytest run never imports torch.


@pytest.fixture(scope="module")
def workerstart_loader():
    """The loader the suite judges; ``None``: the one the settings name (``--workerstart-loader``).

    Override it in a conftest (module or session scope) to run the suite's
    checks from a project's own tests, as anyio's ``anyio_backend`` is
    overridden: return a factory, a SPEC, or ``(factory, {"parallelism_kwarg":
    ..., "capabilities": {...}})`` (see docs/adapter.md).
    """
    return None


@pytest.fixture
def workerstart_context(tmp_path_factory):
    """Factory: ``workerstart_context("spawn", num_workers=4, faults=plan)`` -> InstrumentedContext."""
    from pytest_workerstart.probes.context import InstrumentedContext

    made = []

    def make(method: str = "spawn", *, num_workers: int = 1, faults=None, hold_for_overlap: float | None = None):
        ctx = InstrumentedContext(method, num_workers=num_workers, faults=faults,
                                  log_dir=tmp_path_factory.mktemp("ws-events"),
                                  hold_for_overlap=hold_for_overlap)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


@pytest.fixture
def workerstart_faults():
    """The :class:`~pytest_workerstart.probes.faults.FaultPlan` builder."""
    from pytest_workerstart.probes.faults import FaultPlan

    return FaultPlan


@pytest.fixture
def workerstart_no_leaks(request):
    """Fails the test with a leak report if it leaves anything behind, also ``/dev/shm``
    entries its processes created and left after they exited (those are unlinked)."""
    from pytest_workerstart.harness.cleanup import unlink_left
    from pytest_workerstart.probes.leaks import LeakSnapshot
    from pytest_workerstart.probes.shm import ShmWatch

    before = LeakSnapshot.take()
    with ShmWatch() as shm:
        yield before
    report = LeakSnapshot.wait_clean(before)
    left = shm.left()
    unlink_left(shm)
    lines = [report.format()] if report else []
    lines += [f"  /dev/shm (left by an exited process, unlinked): {name}" for name in left if name not in report.shm]
    if lines:
        pytest.fail(f"leaks after {request.node.name}:\n" + "\n".join(lines), pytrace=False)


@pytest.fixture
def workerstart_digest():
    """``workerstart_digest(batch) -> hex SHA-256`` over the canonical walk."""
    from pytest_workerstart.probes.digest import batch_digest

    return batch_digest


@pytest.fixture
def workerstart_clean_exit():
    """``workerstart_clean_exit("module:function", **kwargs) -> CleanExit``: run it in a fresh
    interpreter that then exits; ``.problems()`` lists a non-zero status, any stderr, leftovers."""
    from pytest_workerstart.harness.clean_exit import run_clean_exit
    from pytest_workerstart.scenarios import child_env

    def run(target: str, *, timeout: float = 120.0, exit_grace: float = 5.0, **kwargs):
        return run_clean_exit(target, kwargs, timeout=timeout, exit_grace=exit_grace, env=child_env())

    return run


@pytest.fixture
def workerstart_assert_startup_speedup():
    """``assert_startup_speedup(factory_spec, dataset_spec, ..., threshold)``; see docs/fixtures.md."""
    from pytest_workerstart.harness.trials import assert_startup_speedup

    return assert_startup_speedup


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for item in items:
        if item.get_closest_marker("workerstart_no_leaks") and "workerstart_no_leaks" not in item.fixturenames:
            item.fixturenames.insert(0, "workerstart_no_leaks")
