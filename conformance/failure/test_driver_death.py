"""failure.driver_killed: nothing the driver started may outlive it.

The scenario process drives the loader (after its first batch, or while the
last worker is still starting), is killed with SIGKILL or leaves with
``os._exit(0)``, and every process it created (workers, forkserver, resource
tracker, grandchildren; recorded with create times before the kill) must exit on its
own, along with any ``/dev/shm`` entry created meanwhile: gone within
``--workerstart-driver-death-timeout`` (default: :func:`_bound`), or, past it, still
exiting (using CPU, or fewer of them every 2 s) and gone within 3 bounds. A survivor that
makes no progress past the bound is listed, then killed.
"""

import functools

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.conformance.failure.driver_death import scenario_driver
from pytest_workerstart.harness.driver_death import run_driver_death
from pytest_workerstart.harness.lookahead import planned_scenario
from pytest_workerstart.probes import leaks
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 2
#: how often a worker may poll for its dead parent (torch's watchdog: every 5 s)
PARENT_POLL_S = 5.0


def _bound(env) -> float:
    """The setting, else one poll for the dead parent, then the failure patience for the teardown."""
    given = env.settings.driver_death_timeout
    return given if given is not None else PARENT_POLL_S + leaks.patience(env.boot_cost())


def _plan(env, case, exit_mode):
    if env.settings.profile == "quick" and (case, exit_mode) != ("mid_start", "sigkill"):
        pytest.skip("quick profile: a SIGKILL mid-start only")
    return functools.partial(
        run_driver_death, scenarios.target_of(scenario_driver),
        {"loader": env.loader.payload(), "context": env.context_name, "case": case, "num_workers": N,
         "parallelism": env.parallelism(N)},
        exit_mode=exit_mode, bound=_bound(env), env=scenarios.child_env(), warm=True)


@check("failure.driver_killed", "nothing the driver started outlives it", requires=("driver_watchdog",))
@planned_scenario(_plan)
@pytest.mark.parametrize("case", ["after_first_batch", "mid_start"])
@pytest.mark.parametrize("exit_mode", ["sigkill", "exit"])
def test_driver_killed(check_env, case, exit_mode):
    """killing the driving process (SIGKILL, and `os._exit(0)`) after the first batch or mid-start leaves no
    worker, forkserver, resource tracker or `/dev/shm` entry (of those the scenario's tree mapped or held open
    at the kill) after the bound (`--workerstart-driver-death-timeout`, default 5 s for a worker's poll of its
    dead parent plus the failure patience, max(5 s, 2 × boot cost): 11-12 s on a quiet 2-core machine), unless
    at the bound what is left is still exiting on its own (it used CPU, or fewer processes remain, in each 2 s)
    and is gone within 3 bounds; the verdict records when the tree was gone (`gone_after_s`) beside the bound
    (`bound_s`)

    Observed by: process tree walked before the kill (pid + start time, never pid alone) plus the scenario's
    session id; survivors listed with pid, cmdline and age, then killed
    """
    bound = _bound(check_env)
    res = check_env.scenario_result()
    if res.setup_error:
        pytest.fail(res.report(), pytrace=False)
    # how close to the bound the tree went: None, it outlived it
    record_measurements(check_env.request.node, bound_s=round(bound, 1),
                        gone_after_s=None if res.gone_after_s is None else round(res.gone_after_s, 2))
    assert res.ok, (f"{len(res.survivors)} process(es) and {len(res.shm_left)} /dev/shm entr(ies) outlived the "
                    f"driver by {bound:.0f} s, the bound, and made no progress to exit since ({exit_mode}, {case}); "
                    f"killed by the suite:\n{res.report()}")
