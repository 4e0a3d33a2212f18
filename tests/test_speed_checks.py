"""Speed checks measured end to end, under spawn in the full profile.

Each run is one shared measurement (3 configurations x 2 or 3 rounds of fresh-process trials,
two to three minutes on 2 cores), so these run alone (``-m speed``), after the other self-tests:
the reference passes all three ids; a speed broken loader named in
``WORKERSTART_SPEED_E2E`` fails its target and nothing unrelated. Every speed broken
loader's decision is tested on its recorded series (tests/test_speed_judges.py), which
costs no measurement. A run the suite refused to judge (a busy machine) is a skip, which CI's
speed stage turns into a failure (``--skips-fail``).
"""

import os

import pytest

from pytest_workerstart.fixtures.broken import catalog

_, SPEED_CATCHES = catalog.load()

pytestmark = pytest.mark.slow
#: The speed broken loaders measured end to end in CI. None: each one's decision is tested on
#: its recorded series (tests/test_speed_judges.py), and a full measurement of one costs the
#: speed stage as much as the reference's; ``WORKERSTART_SPEED_E2E=FakeParallel,...`` measures them.
END_TO_END = tuple(n for n in os.environ.get("WORKERSTART_SPEED_E2E", "").split(",") if n)
SPEED_IDS = ("speed.startup", "speed.steady_state", "speed.memory")
ARGS = ("--workerstart-context=spawn", "--workerstart-profile=full", "-k", "speed")


def _judged(verdict):
    """Skip this self-test when the suite (rightly) refused to judge speed on a busy machine."""
    reasons = [r for c in SPEED_IDS for r in verdict.reasons(c) if "speed not judged" in r]
    if reasons:
        pytest.skip(reasons[0])
    return verdict


@pytest.mark.speed
@pytest.mark.timeout(2000)
def test_reference_passes_every_speed_check(run_suite):
    verdict = _judged(run_suite(*ARGS, timeout=1900))
    for check_id in SPEED_IDS:
        assert verdict.outcomes(check_id) == ["passed"], (
            f"{check_id}: {verdict.outcomes(check_id)}\n{verdict.result.stdout.str()[-3000:]}")


if END_TO_END:  # an empty parametrization would be a skip, which the speed stage fails
    @pytest.mark.speed
    @pytest.mark.timeout(2000)
    @pytest.mark.parametrize("name", END_TO_END)
    def test_speed_broken_loader_is_caught(run_suite, name):
        (target,), related = SPEED_CATCHES[name].targets, SPEED_CATCHES[name].related
        verdict = _judged(run_suite(f"--workerstart-loader={SPEED_CATCHES[name].spec}", *ARGS, timeout=1900))
        assert verdict.outcomes(target) == ["failed"], (
            f"{name}: {target} did not fail: {verdict.outcomes(target)}\n{verdict.result.stdout.str()[-3000:]}")
        collateral = verdict.failed_ids() - {target} - set(related)
        assert not collateral, f"{name}: unrelated speed checks failed too: {sorted(collateral)}"


def test_speed_checks_skip_in_quick_profile_and_under_xdist(run_suite, monkeypatch):
    # no preflight: nothing here needs a worker booted
    verdict = run_suite("--workerstart-context=spawn", "--workerstart-profile=quick", "-k", "speed",
                        "--workerstart-preflight=false")
    assert all(verdict.outcomes(c) == ["skipped"] for c in SPEED_IDS), verdict.result.stdout.str()[-2000:]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    verdict = run_suite("--workerstart-context=spawn", "--workerstart-profile=full", "-k", "speed",
                        "--workerstart-preflight=false")
    assert all(verdict.outcomes(c) == ["skipped"] for c in SPEED_IDS), verdict.result.stdout.str()[-2000:]
    assert "never under xdist" in verdict.result.stdout.str()


@pytest.mark.speed
def test_speed_is_not_judged_on_a_busy_machine(run_suite):
    """Beside two CPU hogs the speed checks are skipped with the numbers, not failed or passed."""
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # no preflight: what is judged here is the busy guard, which runs before any trial
        verdict = run_suite(*ARGS, "--workerstart-preflight=false")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for check_id in SPEED_IDS:
        assert verdict.outcomes(check_id) == ["skipped"], verdict.result.stdout.str()[-2000:]
        assert "speed not judged: the machine is busy" in verdict.reasons(check_id)[0]
        assert "% of the" in verdict.reasons(check_id)[0]
