"""Mutation self-tests: every check id has a broken loader it catches, and the
reference loader passes the same checks (the passing control).

Each broken loader runs its target check plus a fixed set of cheap sentinel
checks in the quick profile under forkserver; the target must fail, sentinels
not related to the defect must not.
"""

import pytest

from pytest_workerstart import registry
from pytest_workerstart.fixtures.broken import catalog

CATCHES, SPEED_CATCHES = catalog.load()

pytestmark = pytest.mark.slow
SENTINELS = ("start.default_serial", "order.registration", "digest.first_batch", "leaks.clean_exit",
             "transfer.shared_memory")


def test_every_check_id_has_a_broken_loader():
    caught = {t for c in (*CATCHES.values(), *SPEED_CATCHES.values()) for t in c.targets}
    missing = set(registry.CHECKS) - caught
    assert not missing, f"check ids no broken loader fails: {sorted(missing)}"


def _selection(catch) -> list[str]:
    return list(catch.targets) + [s for s in SENTINELS if s not in catch.targets and s not in catch.related]


def test_reference_passes_every_selection(run_suite):
    """The live passing control: the reference on the union of the selections below, with every option they add."""
    ids = sorted({i for c in CATCHES.values() for i in _selection(c)})
    options = sorted({o for c in CATCHES.values() for o in c.options})
    verdict = run_suite("--workerstart-context=forkserver", "--workerstart-profile=quick", "-k", " or ".join(ids),
                        *options)
    assert verdict.data["complete"] and verdict.failed_ids() == set(), verdict.result.stdout.str()[-3000:]
    assert {c["id"] for c in verdict.data["checks"] if c["outcome"] == "passed"} == set(ids)


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_broken_loader_is_caught(run_suite, name):
    catch = CATCHES[name]
    targets = catch.targets
    ids = _selection(catch)
    verdict = run_suite(f"--workerstart-loader={catch.spec}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "-k", " or ".join(ids), *catch.options)
    for target in targets:
        assert "failed" in verdict.outcomes(target), (
            f"{name}: {target} did not fail: {verdict.outcomes(target)}\n{verdict.result.stdout.str()[-2500:]}")
    collateral = verdict.failed_ids() - set(targets) - set(catch.related)
    assert not collateral, f"{name}: unrelated checks failed too: {sorted(collateral)}"
