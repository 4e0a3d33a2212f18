"""The scenario runner: a check's work in a fresh interpreter (see :mod:`.harness.runner`).

A scenario is a ``scenario_*`` function of a clause's room (:mod:`pytest_workerstart.conformance`):
it runs in the child, rebuilds the loader from its SPEC, drives it, and returns plain JSON; the
room's ``judge_*`` functions run in pytest and turn that JSON into a verdict. Anything that might
hang forever or kill the driver runs this way, so pytest itself can never be the casualty.
This module runs them: :func:`run`, :func:`planned` (a check's plan), :func:`value_of`;
and what each scenario shares: :func:`rebuild`, :func:`stop_if_failed`, :func:`leak_summary`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_workerstart import protocol
from pytest_workerstart.harness.cleanup import kill_workers
from pytest_workerstart.harness.forkserver import warm_forkserver
from pytest_workerstart.harness.reaper import sigchld_ignored
from pytest_workerstart.harness.runner import ScenarioResult, child_env, run_scenario


def target_of(scenario: Callable | str) -> str:
    """``module:function`` of a scenario function (a string is taken as that already)."""
    return scenario if isinstance(scenario, str) else f"{scenario.__module__}:{scenario.__qualname__}"


def run(loader, context: str, scenario: Callable | str, *, timeout: float, memory_limit: int | None = None,
        exit_grace: float = 0.0, warm: bool = False, **kwargs) -> ScenarioResult:
    """Run ``scenario`` (a module-level function, or "module:function") for
    ``loader`` (a LoaderUnderTest) in ``context``, bounded by ``timeout`` seconds
    and ``memory_limit`` bytes of memory (PSS; the runner's default if None);
    ``exit_grace``, ``warm``: see :func:`~pytest_workerstart.harness.runner.run_scenario`."""
    return run_scenario(target_of(scenario), {"loader": loader.payload(), "context": context, **kwargs},
                        timeout=timeout, env=child_env(), memory_limit=memory_limit, exit_grace=exit_grace, warm=warm)


def planned(env, scenario: Callable | str, *, timeout: float, exit_grace: float = 0.0, warm: bool = True,
            **kwargs):
    """What a check's ``@planned_scenario`` plan returns: :func:`run` of ``scenario``
    for ``env``'s loader and context, bounded by the scenario share of the memory limit,
    forked from the zygote unless ``warm=False`` (a truly fresh interpreter)."""
    import functools

    return functools.partial(run, env.loader, env.context_name, scenario, timeout=timeout,
                             memory_limit=env.scenario_memory_limit, exit_grace=exit_grace, warm=warm, **kwargs)


def value_of(res: ScenarioResult) -> Any:
    """The scenario's return value; the check fails with the details if it did not return."""
    if res.status != "ok":
        pytest.fail(res.details(), pytrace=False)
    return res.value


def rebuild(loader: dict, context: str):
    """In the scenario process: the loader under test from its payload; multiprocessing's
    forkserver gets the suite's preload list if the loader ever starts it."""
    built = protocol.from_payload(loader)
    if context == "forkserver":
        warm_forkserver(start=False)
    return built


def leak_summary(after) -> str:
    return after.summary() if after is not None else "not judged: processes were alive while the error was held"


def stop_if_failed(live, ctx) -> None:
    """The leak rule failed while the error was held, so the judge reads nothing after it:
    kill the loader's workers rather than wait out its own shutdown (torch joins each for 5 s)."""
    if live:
        with sigchld_ignored():  # a loader's SIGCHLD handler (torch's) would raise for the workers killed here
            kill_workers(ctx)
