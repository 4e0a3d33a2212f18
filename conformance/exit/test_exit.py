"""exit.clean_interpreter: a program that used the loader ends cleanly.

Judged from outside a scenario interpreter (forked from the suite's preloaded
zygote, :mod:`pytest_workerstart.harness.zygote`; see
:mod:`pytest_workerstart.harness.clean_exit`): exit status 0, nothing at all on
stderr (no ``resource_tracker: There appear to be N leaked semaphore objects``, no
``Exception ignored in``, no warning) from the loader's first build on (what importing its
packages printed before is reported as ``stderr_before_build``, not judged), and nothing it started still running
``--workerstart-exit-timeout`` seconds after it exited. The truth is the
interpreter's own exit status and output, not anything the loader reports.
"""

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.conformance.exit.clean_exit import scenario_clean_exit
from pytest_workerstart.cores import usable_cores
from pytest_workerstart.harness.clean_exit import CleanExit
from pytest_workerstart.harness.lookahead import planned_scenario
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 2
ENDINGS = ["exhaustion", "persistent", "early_break", "keyboard_interrupt"]


def _plan(env, ending):
    if env.settings.profile == "quick" and ending != "early_break":
        pytest.skip("quick profile: the early break only (workers alive at exit)")
    if ending == "persistent" and not env.loader.has("persistent_workers"):
        pytest.skip("loader does not declare capability 'persistent_workers'")
    # no more workers than cores: torch warns on stderr otherwise, rightly, about the test's choice
    n = max(1, min(N, usable_cores()))
    # Forked from the zygote (torch already imported, nothing else: the loader's module, its
    # resource tracker, forkserver and workers are the child's own), the child ends through the
    # interpreter's normal exit, which is what is judged; only torch's own import-time output
    # would not reach its stderr, and that is not the loader's.
    return scenarios.planned(env, scenario_clean_exit, timeout=180, exit_grace=env.settings.exit_timeout,
                             ending=ending, num_workers=n, parallelism=env.parallelism(n))


@check("exit.clean_interpreter", "a fresh interpreter that used the loader exits 0, prints nothing on "
       "stderr and leaves nothing running", parallel_path=True)
@planned_scenario(_plan)
@pytest.mark.parametrize("ending", ENDINGS)
def test_clean_interpreter(check_env, ending):
    """a scenario interpreter (forked from the suite's zygote, which has imported torch and nothing of the loader;
    the loader's module, resource tracker, forkserver and workers are its own) that uses the loader and then
    ends through the interpreter's normal exit exits with status 0, writes nothing at all to stderr from the
    loader's first build on (no `resource_tracker: There appear to be N leaked semaphore/shared_memory objects`,
    no `Exception ignored in`, no warning; what importing the loader's packages printed before that build is
    reported in the case's `measurements.stderr_before_build`, not judged), and nothing it started (workers,
    forkserver, resource tracker) is still running `--workerstart-exit-timeout` seconds (default 5 s) after it
    exited, nor is any `/dev/shm` entry its processes created (an untracked `SharedMemory` block says nothing on
    stderr; such entries are unlinked by the suite). Four endings, each its own case: one epoch to the end; two
    epochs with persistent workers (and `pin_memory=True` where an accelerator exists; without one torch pins
    nothing), the loader still referenced at exit; `for batch in loader: break` with loader and batch still
    referenced at exit; Ctrl-C as a terminal sends it (SIGINT to the scenario's process group, driver and
    workers) in batch 2, once every worker is inside the dataset (its samples after the first two batches hold
    the worker that fetches them until the signal: where the signal lands is the suite's choice, not the
    machine's; the workers held are recorded in `measurements.workers_held`), caught by the script.
    `num_workers` = min(${N}, usable cores): more would make torch warn on stderr, rightly, about the test's own
    choice. Quick profile: the early break only

    Observed by: the interpreter's exit status, its stderr (and its descendants'), the processes of its session
    after it exited
    """
    ended = CleanExit(check_env.scenario_result())
    held = ended.said("workers_held")
    if held is not None:
        record_measurements(check_env.request.node, workers_held=held)
    if ended.before_build.strip():
        record_measurements(check_env.request.node, stderr_before_build=ended.before_build.strip()[-600:])
    problems = ended.problems()
    assert not problems, f"after {ending.replace('_', ' ')}: " + "; ".join(problems)
