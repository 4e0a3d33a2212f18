"""A scenario check whose first run failed is judged again (``--workerstart-failure-runs``).

What a scenario observes (a worker that dies mid-start, Ctrl-C in batch 2, a killed driver)
can depend on timing inside the loader that the suite does not place. A case that failed and
then passes is not a pass: it fails as ``unstable: failed k of n``, and the verdict lists each
run's outcome (``measurements.runs``). A first run that passes is not repeated: that would cost
a scenario per case, and the failure it might show is named only when it is seen.
"""

from __future__ import annotations

import inspect

import pytest

from pytest_workerstart.verdict import record_measurements

#: what a check's judgement raises when the clause does not hold (anything else is an error)
JUDGEMENT = (AssertionError, pytest.fail.Exception)


def _first_line(exc: BaseException) -> str:
    text = exc.msg if isinstance(exc, pytest.fail.Exception) else str(exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:500]


def judge_again(item: pytest.Function, first: BaseException, runs: int) -> None:
    """Run ``item``'s check again, up to ``runs`` runs in all or until one passes; raise its failure."""
    args = {name: item.funcargs[name] for name in inspect.signature(item.obj).parameters}
    outcomes = ["failed"]
    while len(outcomes) < runs:
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
