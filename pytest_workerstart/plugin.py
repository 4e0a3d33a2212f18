"""pytest entry point of pytest-workerstart.

Inert unless ``--workerstart`` is given: this module imports only pytest and the
standard library, registers options, markers and the public fixtures (whose
bodies import the probes lazily), and nothing else. With ``--workerstart`` it
resolves the loader and hands the session to :mod:`pytest_workerstart.session`.

Option precedence (documented in docs/usage.md):

* loader: ``--workerstart-loader`` > env ``WORKERSTART_LOADER`` > ini
  ``workerstart_loader`` > ``reference``;
* every other option: command line > ini > default.
"""

from __future__ import annotations

import os

import pytest

ENV_LOADER = "WORKERSTART_LOADER"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("workerstart", "worker-start conformance suite (pytest-workerstart)")
    group.addoption("--workerstart", action="store_true", default=False,
                    help="collect and run the worker-start conformance suite (in addition to any paths given)")
    group.addoption("--workerstart-loader", metavar="SPEC", default=None,
                    help="loader under test: reference, torch, torchdata or module:attribute "
                         f"(precedence: this option > ${ENV_LOADER} > ini workerstart_loader > reference)")
    group.addoption("--workerstart-parallelism-kwarg", metavar="NAME", default=None,
                    help="keyword that sets start parallelism ('none': the loader has no parallel start)")
    group.addoption("--workerstart-capability", metavar="NAME=VALUE", action="append", default=[],
                    help="declare or override a capability, e.g. parallel_start=spawn,forkserver (repeatable)")
    group.addoption("--workerstart-context", metavar="LIST", default=None,
                    help="comma-separated contexts to check (default: every context the platform offers)")
    group.addoption("--workerstart-json", metavar="PATH", default=None,
                    help="write a machine-readable verdict to PATH")
    group.addoption("--workerstart-xfail", metavar="FILE", default=None,
                    help="file of expected failures: one 'check.id[context]: reason' per line")
    group.addoption("--workerstart-strict", action="store_true", default=None,
                    help="also fail on fds/semaphores/shm held only through a referenced exception")
    group.addoption("--workerstart-profile", choices=("quick", "full"), default=None,
                    help="quick: one fault position, one p, forkserver where the clause is not about spawn")
    group.addoption("--workerstart-min-speedup", metavar="X", type=float, default=None,
                    help="speed.startup threshold (default: derived from boot cost and usable cores)")
    group.addoption("--workerstart-driver-death-timeout", metavar="S", type=float, default=None,
                    help="seconds every process of a killed driver has to disappear (default 15)")
    parser.addini("workerstart_loader", "default loader SPEC for --workerstart", default=None)
    parser.addini("workerstart_capabilities", "NAME=VALUE capability declarations", type="linelist", default=[])
    parser.addini("workerstart_context", "comma-separated contexts to check", default=None)
    parser.addini("workerstart_profile", "quick or full", default=None)
    parser.addini("workerstart_strict", "strict leak mode", type="bool", default=False)
    parser.addini("workerstart_driver_death_timeout", "driver-death bound in seconds", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "workerstart_check(check_id, **requirements): a conformance check with a stable id")
    config.addinivalue_line("markers", "workerstart_no_leaks: fail the test if it leaks processes, threads, fds, semaphores or shm")
    if not config.getoption("workerstart"):
        return
    from pytest_workerstart import harness
    from pytest_workerstart.session import WorkerstartSession

    config.pluginmanager.register(WorkerstartSession.from_config(config), "workerstart-session")
    config.pluginmanager.register(harness, "workerstart-harness")


def resolve_loader_spec(config: pytest.Config) -> str:
    """The loader SPEC after applying the documented precedence."""
    return (
        config.getoption("workerstart_loader")
        or os.environ.get(ENV_LOADER)
        or config.getini("workerstart_loader")
        or "reference"
    )


# --- public fixtures ---------------------------------------------------------
# Bodies import lazily so that a plain pytest run never imports torch.


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
    """Fails the test with a leak report if it leaves anything behind."""
    from pytest_workerstart.probes.leaks import LeakSnapshot

    before = LeakSnapshot.take()
    yield before
    report = LeakSnapshot.wait_clean(before)
    if report:
        pytest.fail(f"leaks after {request.node.name}:\n{report.format()}", pytrace=False)


@pytest.fixture
def workerstart_digest():
    """``workerstart_digest(batch) -> hex SHA-256`` over the canonical walk."""
    from pytest_workerstart.probes.digest import batch_digest

    return batch_digest


@pytest.fixture
def workerstart_assert_startup_speedup():
    """``assert_startup_speedup(factory_spec, dataset_spec, ..., threshold)``; see docs/fixtures.md."""
    from pytest_workerstart.probes.timing import assert_startup_speedup

    return assert_startup_speedup


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for item in items:
        if item.get_closest_marker("workerstart_no_leaks") and "workerstart_no_leaks" not in item.fixturenames:
            item.fixturenames.insert(0, "workerstart_no_leaks")
