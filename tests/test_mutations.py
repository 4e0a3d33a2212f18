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


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_broken_loader_is_caught(run_suite, name):
    catch = CATCHES[name]
    targets = catch.targets
    ids = list(targets) + [s for s in SENTINELS if s not in targets and s not in catch.related]
    verdict = run_suite(f"--workerstart-loader={catch.spec}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "-k", " or ".join(ids), *catch.options)
    for target in targets:
        assert "failed" in verdict.outcomes(target), (
            f"{name}: {target} did not fail: {verdict.outcomes(target)}\n{verdict.result.stdout.str()[-2500:]}")
    collateral = verdict.failed_ids() - set(targets) - set(catch.related)
    assert not collateral, f"{name}: unrelated checks failed too: {sorted(collateral)}"
