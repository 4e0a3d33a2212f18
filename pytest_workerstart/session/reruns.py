"""A check whose first run failed is judged again (``--workerstart-failure-runs``).

What a check observes (a worker that dies mid-start, Ctrl-C in batch 2, a killed driver, a
worker that aborts as the training loop raises) can depend on timing inside the loader that the
suite does not place. A case that failed and then passes is not a pass: it fails as
``unstable: failed k of n``, and the verdict lists each run's outcome (``measurements.runs``).
A first run that passes is not repeated: that would cost a run per case, and the failure it
might show is named only when it is seen. A check judged in the pytest process observes anew in
each run (what its failed run observed is forgotten, not judged twice). Not judged again: the
speed checks (their trials have a stopping rule of their own), a data-path check's explored
case (its points and start schedules are drawn from a seed: a failure there replays as is), and
a check in the pytest process whose step the suite stopped (a hang waits out its deadline again).
"""

from __future__ import annotations

import inspect

import pytest

from pytest_workerstart import explore, parity
from pytest_workerstart.checkenv import OBSERVATIONS
from pytest_workerstart.harness.lookahead import plan_of
from pytest_workerstart.probes.deadline import StepAborted
from pytest_workerstart.verdict import record_measurements

#: what a check's judgement raises when the clause does not hold (anything else is an error)
JUDGEMENT = (AssertionError, pytest.fail.Exception)


def _first_line(exc: BaseException) -> str:
    text = exc.msg if isinstance(exc, pytest.fail.Exception) else str(exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:500]


def judged_again(item: pytest.Function, exc: BaseException) -> bool:
    """Whether a failure of ``item`` is judged again (the module's docstring says which are not)."""
    marker = item.get_closest_marker("workerstart_check")
    if marker is None or marker.args[0].startswith("speed."):
        return False
    if isinstance(exc, StepAborted) and plan_of(item) is None:
        return False  # a step the suite stopped in this process (a hang, a memory blow-up) would be waited out again
    params = getattr(item, "callspec", None)
    return params is None or params.params.get("ws_point") != explore.EXPLORE_CASE


def _forget_observed(item: pytest.Function) -> None:
    """Drop what ``item``'s run observed for the checks that share observations, so the next run
    makes its own (what it reused from an earlier case is that case's, and stays)."""
    for key in (OBSERVATIONS, parity.OBSERVED):
        cache = item.config.stash.get(key, {})
        for made_here in [k for k, entry in cache.items() if entry[0] == item.nodeid]:
            del cache[made_here]


def judge_again(item: pytest.Function, first: BaseException, runs: int) -> None:
    """Run ``item``'s check again, up to ``runs`` runs in all or until one passes; raise its failure."""
    args = {name: item.funcargs[name] for name in inspect.signature(item.obj).parameters}
    outcomes = ["failed"]
    while len(outcomes) < runs:
        _forget_observed(item)
        try:
            item.obj(**args)
        except JUDGEMENT:
            outcomes.append("failed")
            continue
        outcomes.append("passed")
        break
    record_measurements(item, runs=outcomes)
    if "passed" in outcomes:
        pytest.fail(f"unstable: failed {outcomes.count('failed')} of {len(outcomes)}: {_first_line(first)}",
                    pytrace=False)
    raise first
