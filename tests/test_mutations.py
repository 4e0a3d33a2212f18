"""Mutation self-tests: every check id has a broken loader it catches, and the
reference loader passes the same checks (the passing control).

Each broken loader runs its target check plus a fixed set of cheap sentinel
checks in the quick profile under forkserver; the target must fail, sentinels
not related to the defect must not.
"""

import pytest

from pytest_workerstart.fixtures.broken.loaders import CATCHES, SPEED_CATCHES

pytestmark = pytest.mark.slow
MODULE = "pytest_workerstart.fixtures.broken.loaders"
SENTINELS = ("start.default_serial", "order.registration", "digest.first_batch", "leaks.clean_exit",
             "transfer.shared_memory")
ALL_IDS = {
    "start.parameter_validation", "start.default_serial", "start.respects_bound", "start.builds_all_before_start",
    "order.registration", "order.worker_seeds", "digest.first_batch", "failure.parent_start_error",
    "failure.child_exit_during_start", "failure.child_killed_during_start", "failure.child_hang_during_start",
    "failure.worker_init_error", "failure.retry_after_failure", "failure.interrupt_during_start",
    "failure.driver_killed", "leaks.clean_exit", "persistent.reuse", "prefetch.bound",
    "sharding.exactly_once", "transfer.shared_memory", "speed.startup", "speed.steady_state", "speed.memory",
}


def test_every_check_id_has_a_broken_loader():
    caught = {t for targets, _, _ in CATCHES.values() for t in _ids(targets)}
    caught |= {target for target, _ in SPEED_CATCHES.values()}  # tests/test_speed_checks.py
    assert ALL_IDS - caught == set(), f"check ids no broken loader fails: {sorted(ALL_IDS - caught)}"


def _ids(targets):
    return (targets,) if isinstance(targets, str) else tuple(targets)


@pytest.mark.parametrize("name", sorted(CATCHES))
def test_broken_loader_is_caught(run_suite, name):
    targets, related, extra = CATCHES[name]
    targets = _ids(targets)
    ids = list(targets) + [s for s in SENTINELS if s not in targets and s not in related]
    verdict = run_suite(f"--workerstart-loader={MODULE}:{name}", "--workerstart-context=forkserver",
                        "--workerstart-profile=quick", "-k", " or ".join(ids), *extra)
    for target in targets:
        assert "failed" in verdict.outcomes(target), (
            f"{name}: {target} did not fail: {verdict.outcomes(target)}\n{verdict.result.stdout.str()[-2500:]}")
    collateral = verdict.failed_ids() - set(targets) - set(related)
    assert not collateral, f"{name}: unrelated checks failed too: {sorted(collateral)}"
