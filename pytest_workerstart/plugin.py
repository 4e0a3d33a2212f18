"""pytest entry point of pytest-workerstart.

Inert unless ``--workerstart`` is given: it registers options, markers and the
public fixtures (:mod:`pytest_workerstart.fixtures.public`), none of which
imports torch, and nothing else. With ``--workerstart`` it resolves the settings once (see
:mod:`pytest_workerstart.settings` for the precedence) and hands the run to
:mod:`pytest_workerstart.session`.
"""

from __future__ import annotations

import pytest

from pytest_workerstart import settings as _settings
from pytest_workerstart.harness import reaper, runner

#: the fixtures users put in their own tests, registered with the plugin
pytest_plugins = ("pytest_workerstart.fixtures.public",)


def pytest_addoption(parser: pytest.Parser) -> None:
    _settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers",
                            "workerstart_check(check_id, title=None, **requirements): a conformance check with a "
                            "stable id (declared once, with its title and requirements: pytest_workerstart.registry)")
    config.addinivalue_line("markers", "workerstart_scenario(plan): the check's work is the scenario plan(check_env, "
                            "**params) returns; consecutive ones run ahead, --workerstart-scenario-jobs at a time")
    config.addinivalue_line("markers", "workerstart_no_leaks: fail the test if it leaks processes, threads, fds, "
                            "semaphores or shm")
    if config.getoption("workerstart"):
        _start_session(config, embedded=False)


def _start_session(config: pytest.Config, embedded: bool):
    """Resolve the settings once and register the suite's session and check environment."""
    resolved = config.stash[_settings.SETTINGS] = _settings.resolve(config)
    if not embedded and resolved.preflight and _settings.runs_checks(config):
        runner.prestart_zygote()  # the preflight's zygote imports torch while this process does
    # the suite's session and checks pull in torch: imported only when a run asks for them
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
    session = _start_session(config, embedded=True)
    reaper.start_guard(verdict=session.reporter.json_path)  # pytest_sessionstart has already run
    return None


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for item in items:
        if item.get_closest_marker("workerstart_no_leaks") and "workerstart_no_leaks" not in item.fixturenames:
            item.fixturenames.insert(0, "workerstart_no_leaks")
