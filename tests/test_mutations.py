"""Mutation self-tests: every check id has a broken loader it catches, and the
reference loader passes the same checks (the passing control).

Each broken loader runs its target check plus a fixed set of cheap sentinel
checks in the quick profile under forkserver; the target must fail, sentinels
not related to the defect must not.
"""

import pytest

from pytest_workerstart.fixtures.broken.loaders import CATCHES

MODULE = "pytest_workerstart.fixtures.broken.loaders"
SENTINELS = ("start.default_serial", "order.registration", "digest.first_batch", "leaks.clean_exit",
             "transfer.shared_memory")
ALL_IDS = {
    "start.parameter_validation", "start.default_serial", "start.respects_bound", "start.builds_all_before_start",
    "order.registration", "order.worker_seeds", "digest.first_batch", "failure.parent_start_error",
    "failure.child_exit_during_start", "failure.child_killed_during_start", "failure.child_hang_during_start",
    "failure.worker_init_error", "failure.retry_after_failure", "failure.interrupt_during_start",
    "failure.driver_killed", "leaks.clean_exit", "persistent.reuse", "prefetch.bound",
    "sharding.exactly_once", "transfer.shared_memory",
}


def test_every_check_id_has_a_broken_loader():
    caught = {target for target, _, _ in CATCHES.values()}
    assert ALL_IDS - caught == set(), f"check ids no broken loader fails: {sorted(ALL_IDS - caught)}"


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_broken_loader_is_caught(run_suite, name):
    target, related, extra = CATCHES[name]
    ids = [target] + [s for s in SENTINELS if s != target and s not in related]
    verdict = run_suite(f"--workerstart-loader={MODULE}:{name}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "-k", " or ".join(ids), *extra)
    assert "failed" in verdict.outcomes(target), (
        f"{name}: {target} did not fail: {verdict.outcomes(target)}\n{verdict.result.stdout.str()[-2500:]}")
    collateral = verdict.failed_ids() - {target} - set(related)
    assert not collateral, f"{name}: unrelated checks failed too: {sorted(collateral)}"
