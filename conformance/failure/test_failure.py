"""Failure clause: a failed start, a dying child, a failing worker_init_fn or a
Ctrl-C mid-start gives a clear error naming the worker, and leaves nothing.

Leak contract (see ``CheckEnv.assert_clean_around``): while the exception is
still referenced, no live or zombie child and no extra thread; once released
and collected, no extra fd, semaphore or shm segment. ``--workerstart-strict``
also fails on what only the referenced exception keeps alive.

Checks whose loader might hang or take the driver down (child faults,
SIGINT) run in a fresh interpreter under the scenario runner's hard timeout.
"""

import re

import pytest
import torch

from pytest_workerstart import scenarios
from pytest_workerstart.bounded import batches_of
from pytest_workerstart.conformance.failure import child_faults, forkserver_died, interrupt
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.harness.clean_exit import CleanExit
from pytest_workerstart.harness.lookahead import planned_scenario
from pytest_workerstart.probes.faults import (
    DEATH_STATES,
    FaultPlan,
    InjectedStartError,
    InjectedWorkerInitError,
    exception_chain,
    position_to_worker,
)
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 3


def _positions(check_env):
    return ["middle"] if check_env.settings.profile == "quick" else ["first", "middle", "last"]


def _ps(check_env):
    if not check_env.parallel_start_here:
        return [None]
    return [N] if check_env.settings.profile == "quick" else [1, N]


def _assert_names_worker(exc, worker, pids=()):
    text = " | ".join(f"{type(e).__name__}: {e}" for e in exception_chain(exc))
    names = [f"worker {worker}", f"worker process {worker}", *(f"pid {p}" for p in pids), *(str(p) for p in pids)]
    assert any(n in text for n in names), f"the error does not name worker {worker}: {text[:400]}"


def _take_batches(loader, n):
    """The error may come at iter() or at any next() up to the first batch that
    needs the failed worker (batch k of an in-order loader): a loader may defer
    starts it does not need yet, but never yields past a worker that failed."""
    it = iter(loader)
    for _ in range(n):
        next(it)


@check("failure.parent_start_error", "a failing start() surfaces naming the worker; leak rule")
@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_parent_start_error(check_env, position):
    """the k-th `start()` raising `OSError(EAGAIN)` (k first/middle/last, p in {1, N}) surfaces as that error or
    one chained from it naming the worker (chained: through `__cause__`, or `__context__` unless suppressed;
    `raise … from None` hides the original and does not count), at `iter()` or at a `next()` no later than the
    one that needs worker k (batch k): a loader may defer starts the first batches do not need, but never yields
    past a failed worker; leak rule

    Observed by: fault plan in the instrumented context; leak snapshots
    """
    if position not in _positions(check_env):
        pytest.skip("quick profile: one fault position")
    k = position_to_worker(position, N)
    for p in _ps(check_env):
        before = check_env.snapshot()
        ctx = check_env.context(N, faults=FaultPlan.start_error(k))
        loader = check_env.make(WorkerTagDataset(12), num_workers=N, ctx=ctx, parallelism=p)
        held = check_env.run_expecting_failure(lambda loader=loader: _take_batches(loader, k + 1))
        chain = list(exception_chain(held.exc))
        assert any(isinstance(e, InjectedStartError) for e in chain), (
            f"p={p}: expected the injected OSError (or an error chained from it), got {held.exc!r}")
        if not isinstance(held.exc, InjectedStartError):
            _assert_names_worker(held.exc, k)
        del chain
        check_env.assert_clean_around(before, held, f"start of worker {k} failed (p={p})", N, ctx)
        del loader


@check("failure.worker_init_error", "a raising worker_init_fn surfaces with the worker's id",
       requires=("worker_init_fn",))
def test_worker_init_error(check_env, tmp_path):
    """`worker_init_fn` raising in worker k surfaces with the worker's id; releasing the error sets off a shutdown
    that returns within the failure patience, and nothing leaks once released

    Observed by: picklable fault `worker_init_fn`
    """
    k = 1
    before = check_env.snapshot()
    ctx = check_env.context(N)
    loader = check_env.make(WorkerTagDataset(12), num_workers=N, ctx=ctx, parallelism=check_env.parallelism(N),
                            worker_init_fn=FaultPlan.worker_init_fn(k))
    held = check_env.run_expecting_failure(lambda loader=loader: batches_of(loader))
    assert any(isinstance(e, InjectedWorkerInitError) or "InjectedWorkerInitError" in str(e)
               for e in exception_chain(held.exc)), f"the worker_init_fn error did not surface: {held.exc!r}"
    _assert_names_worker(held.exc, k)
    check_env.release_held(held, N, ctx)
    del loader
    check_env.assert_clean(before, f"worker_init_fn of worker {k} raised")


@check("failure.retry_after_failure", "after a failed start, a fresh iter() yields the truth")
@pytest.mark.parametrize("failure", ["parent_start_error", "worker_init_error"])
def test_retry_after_failure(check_env, failure, tmp_path):
    """after a failed start or init, a fresh `iter()` on the same loader yields the truth

    Observed by:
    """
    k = 1
    ds = WorkerTagDataset(12)
    truth = [int(i) for b in batches_of(torch.utils.data.DataLoader(ds, batch_size=2)) for i in b["index"]]
    p = check_env.parallelism(N)
    if failure == "parent_start_error":
        ctx = check_env.context(N, faults=FaultPlan.start_error(k))
        loader = check_env.make(ds, num_workers=N, ctx=ctx, parallelism=p)
    else:
        if not check_env.loader.has("worker_init_fn"):
            pytest.skip("loader does not declare capability 'worker_init_fn'")
        ctx = check_env.context(N)
        loader = check_env.make(ds, num_workers=N, ctx=ctx, parallelism=p,
                         worker_init_fn=FaultPlan.worker_init_fn(k, once_path=str(tmp_path / "fired")))
    held = check_env.run_expecting_failure(lambda: batches_of(loader))
    check_env.release_held(held, N, ctx)
    ctx.begin_generation()
    got = [int(i) for b in batches_of(loader) for i in b["index"]]
    assert got == truth, f"after a {failure}, a fresh iter() gave {got[:8]}... instead of the truth {truth[:8]}..."


#: the death states the quick profile judges: the one every loader reaches, and the one where
#: a loader that only checks its workers as ``iter()`` returns is caught
QUICK_DEATH_STATES = ("in_start", "while_waiting")


def _child_fault(fault: str, loader_timeout: float):
    """The plan of a worker fault during start (``loader_timeout`` 0: the loader's
    default, none: a dead worker must be noticed, not timed out). A death is placed at each
    state of :data:`DEATH_STATES` in turn (the quick profile: :data:`QUICK_DEATH_STATES`); a
    hang has no state: it never ends."""
    def plan(env):
        if fault == "child_hang":
            states = (None,)
            # the hang's timeout grows with the boot cost, and doubles on each inconclusive try
            # (child_faults.scenario_child_fault): so does the bound
            bound = max(60.0, 2 * (env.step_timeout(N) or 30.0)) * child_faults.HANG_TRIES
        else:
            states = QUICK_DEATH_STATES if env.settings.profile == "quick" else DEATH_STATES
            bound = 40 * len(states)
        return scenarios.planned(env, child_faults.scenario_child_fault, timeout=bound, fault=fault, worker=1,
                                 num_workers=N, parallelism=env.parallelism(N), loader_timeout=loader_timeout,
                                 boot_cost=env.boot_cost(), states=states)
    return plan


#: the ``timeout=`` a worker hang is asked to be noticed in, before it is raised to cover boots
#: (:func:`pytest_workerstart.conformance.failure.child_faults.hang_timeout`)
HANG_TIMEOUT_S = 2.0


def _judge_child_fault(check_env, timeout: float | None = None) -> None:
    out = scenarios.value_of(check_env.scenario_result())

    def note(outcomes):
        by_state = {run["at"] or "boot": {k: round(run[k], 2) if isinstance(run[k], float) else run[k]
                                          for k in child_faults.CHILD_FAULT_MEASUREMENTS if k in run}
                    for run in out["states"]}
        record_measurements(check_env.request.node, states=outcomes, by_state=by_state)

    child_faults.judge_child_fault(out, worker=1, timeout=timeout, note=note)


@check("failure.child_exit_during_start", "a worker exiting during boot gives an error naming it")
@planned_scenario(_child_fault("child_exit", loader_timeout=0))
def test_child_exit_during_start(check_env):
    """a worker exiting non-zero during boot gives an error naming it (id or pid) without a loader timeout, within
    5 s + slack of the last worker becoming ready or dying, if later (slack = max(10 s, 2 × the slowest boot
    measured in the scenario); a loader still running 5 s past that bound is stopped there and fails); leak rule
    (no process or thread of the loader alive while the error is held, nothing once released). The death is
    placed at each state in turn, reached by synchronisation, not by timing: `in_start` (before the worker's own
    `start()` returns, which waits for it), `before_send` (as the driver begins its next put on a queue made
    through the context, which waits for it; the worker stays alive while other workers start) and
    `while_waiting` (once the driver, having sent work, first waits for a result on such a queue); the quick
    profile judges `in_start` (the state every loader reaches) and `while_waiting`. The reason names each state
    that failed; a state the loader never reaches (it uses no context `Queue`) is reported as not reached, not
    judged

    Observed by: child-side fault gated by the instrumented context (start, queue put and get); scenario
    process with a hard timeout
    """
    _judge_child_fault(check_env)


@check("failure.child_killed_during_start", "a worker killed during boot gives an error naming it")
@planned_scenario(_child_fault("child_kill", loader_timeout=0))
def test_child_killed_during_start(check_env):
    """same for a worker that SIGKILLs itself during boot, at the same states

    Observed by: same
    """
    _judge_child_fault(check_env)


@check("failure.child_hang_during_start", "a worker hanging during boot is timed out, naming it",
       requires=("timeout",))
@planned_scenario(_child_fault("child_hang", loader_timeout=HANG_TIMEOUT_S))
def test_child_hang_during_start(check_env):
    """a worker hanging during boot: a loader with `timeout=` at least ${HANG_TIMEOUT_S} s and at least k ×
    num_workers × the boot cost measured in the run (one spawn worker's import of torch and the loader, timed by
    the preflight; k = 1.5 under spawn, where every boot is such an import; k = 0.5 under forkserver and fork,
    where a worker boots by forking but the scenario starts the server and slows down with the same load), since
    the first batch waits for worker 0's boot, which competes with the others', raises within that timeout +
    slack of the last worker becoming ready (slack = max(10 s, 2 × the slowest boot measured in the same
    scenario), so other workers' boots on a loaded machine do not count), naming the worker; nothing left
    running. A loader still running 5 s past that bound is stopped there and fails. A try whose timeout could
    fire before a healthy worker was ready (the load rose since the boot cost was measured: the loader timed out
    rightly) is inconclusive and runs again with twice the timeout, at most 3 tries; the verdict's message names
    the try that was judged

    Observed by: same
    """
    _judge_child_fault(check_env, timeout=HANG_TIMEOUT_S)


def _interrupt_plan(env):
    return scenarios.planned(env, interrupt.scenario_interrupt, timeout=90, worker=1, num_workers=N,
                             parallelism=env.parallelism(N), boot_cost=env.boot_cost())


@check("failure.interrupt_during_start", "Ctrl-C while workers start leaves nothing")
@planned_scenario(_interrupt_plan)
def test_interrupt_during_start(check_env):
    """SIGINT while workers start gives `KeyboardInterrupt`, nothing alive while held, nothing leaked

    Observed by: SIGINT fault at worker k in a scenario process
    """
    interrupt.judge_interrupt(scenarios.value_of(check_env.scenario_result()), strict=check_env.settings.strict)


#: what an error after the forkserver died must say: that it, or the workers, are gone
SAYS_DIED = re.compile(r"forkserver|fork server|exited|died|dead|killed|terminated|no longer (alive|running)", re.I)


FORKSERVER_DIED_WORKERS = 2  # the scenario's epochs are range(4 * workers): the truth below


def _forkserver_died_bound(env) -> float:
    return env.step_timeout(2) or 120.0


def _forkserver_died_plan(env, iterators):
    persistent = iterators == "persistent"
    if persistent and not env.loader.has("persistent_workers"):
        pytest.skip("loader does not declare capability 'persistent_workers'")
    n = FORKSERVER_DIED_WORKERS
    return scenarios.planned(env, forkserver_died.scenario_forkserver_died, timeout=_forkserver_died_bound(env) + 30,
                             exit_grace=env.settings.exit_timeout, persistent=persistent, num_workers=n,
                             parallelism=env.parallelism(n))


@check("failure.forkserver_died", "the forkserver killed between epochs: the next epoch works or raises saying "
       "so, within the step bound; nothing left", contexts=("forkserver",))
@planned_scenario(_forkserver_died_plan)
@pytest.mark.parametrize("iterators", ["fresh", "persistent"])
def test_forkserver_died(check_env, iterators):
    """under forkserver, in a scenario interpreter (the suite's own server is never touched): one epoch of 2
    workers, then SIGKILL to the forkserver process(es) (the driver's direct children whose command line names a
    forkserver: multiprocessing's or a loader's own), then the next epoch, with a fresh iterator and with
    persistent workers (which die with their server): that epoch is the truth (indices 0..7), or it raises an
    error that says the server or the workers died (`forkserver`, `exited`, `died`, `dead`, `killed`,
    `terminated`), in either case within the step bound (`--workerstart-step-timeout` or derived from the boot
    cost); a hang is killed at the bound + 30 s. Nothing the interpreter started, and no `/dev/shm` entry, is
    left after it exits. Skipped if the loader starts no forkserver process

    Observed by: the scenario runner (own session); the index stream against the sequential truth

    The forkserver is killed between two epochs (in a scenario interpreter: the
    suite's own server stays): the next epoch is the truth, or an error that says the
    server or the workers died, within the step bound, and nothing is left after exit.
    """
    bound = _forkserver_died_bound(check_env)
    res = check_env.scenario_result()
    if res.status == "hang":
        pytest.fail(f"after the forkserver was killed, the next epoch neither worked nor raised within "
                    f"{bound + 30:.0f} s, the step bound {bound:.0f} s + 30 s for the first epoch "
                    f"({iterators} iterators)\n{res.details()}", pytrace=False)
    if res.status != "ok":
        pytest.fail(res.details(), pytrace=False)
    out = res.value
    if not out["servers"]:
        pytest.skip("the loader started no forkserver process of its own or multiprocessing's under forkserver")
    truth = list(range(4 * FORKSERVER_DIED_WORKERS))
    assert out["first"] == truth, f"the first epoch gave {out['first']}, not {truth}"
    if "error" in out:
        assert SAYS_DIED.search(out["error"]), (
            f"after the forkserver was killed the next epoch raised an error that does not say the server or its "
            f"workers died ({iterators} iterators): {out['error'][:400]}")
    else:
        assert out["second"] == truth, (
            f"after the forkserver was killed the next epoch gave {out['second']}, not {truth}")
    assert out["elapsed_s"] <= bound, (
        f"after the forkserver was killed the next epoch took {out['elapsed_s']:.1f} s to "
        f"{'fail' if 'error' in out else 'end'}, above the step bound {bound:.1f} s ({iterators} iterators)")
    problems = [p for p in CleanExit(res).problems() if "stderr" not in p]
    assert not problems, f"after the forkserver was killed ({iterators} iterators): " + "; ".join(problems)
