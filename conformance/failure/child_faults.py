"""``failure.child_exit_during_start``, ``failure.child_killed_during_start``,
``failure.child_hang_during_start``: a worker dies or hangs while the workers start; the loader
raises, naming it, within its ``timeout=`` (or a poll) plus a slack, and leaves nothing.

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.harness.cleanup import kill_workers
from pytest_workerstart.harness.reaper import sigchld_ignored
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.deadline import StepAborted, deadline
from pytest_workerstart.probes.faults import FaultPlan, describe_chain, is_dead
from pytest_workerstart.probes.leaks import LeakSnapshot, patience

#: a hanging worker's timeout: fresh-interpreter boots allowed per worker (see scenario_child_fault)
BOOTS_PER_WORKER_SPAWN = 1.5
BOOTS_PER_WORKER_FORKED = 0.5
#: Without ``timeout=``, how long after the last worker was ready a loader has to notice
#: a dead worker (torch polls its workers every 5 s), before the slack of :func:`error_bound`.
NOTICE_S = 5.0
#: past the bound before a running loader is stopped (the judge's own check keeps the exact bound)
OVERDUE_GRACE_S = 5.0
#: runs of a hang scenario at most, each with twice the timeout, while the timeout fires before
#: the healthy workers are ready (a load that rose since the boot cost was measured)
HANG_TRIES = 3


def slowest_boot(recs) -> float:
    """Seconds from ``start()`` to ready of the slowest of these workers' records (0: none ready)."""
    return max((r.ready - r.start_begin for r in recs if r.ready is not None and r.start_begin is not None),
               default=0.0)


def hang_timeout(asked: float, context: str, num_workers: int, boot_cost: float) -> float:
    """The ``timeout=`` a hang scenario gives the loader: ``asked``, raised to cover worker 0's
    boot, which the first batch waits for and which competes with every other worker's. Under
    spawn each boot is a fresh import: 1.5 x N of them, at the boot cost measured in this run
    (on 2 cores with N = 3 the last healthy worker was ready 2.5-2.7 boot costs after
    ``iter()``: N / cores rounds of boots are not enough). A forked worker (forkserver, fork) boots in a
    fraction of one, but its scenario starts the server (an import) and slows down with the
    same load: 0.5 x N. Too short under a load that rose since is not a false failure: the try
    is inconclusive and runs again with twice the timeout (:func:`scenario_child_fault`)."""
    per_worker = BOOTS_PER_WORKER_SPAWN if context == "spawn" else BOOTS_PER_WORKER_FORKED
    return max(asked, round(per_worker * num_workers * boot_cost, 1))


def noticeable(recs, default: float | None = None) -> float:
    """When the error became due to be noticed: the last worker ready, or a death placed
    after that (``while_waiting`` waits for the driver's get)."""
    times = [r.ready for r in recs if r.ready is not None] + [r.death_placed_at for r in recs
                                                             if r.death_placed_at is not None]
    return max(times, default=default if default is not None else time.monotonic())


def error_bound(loader_timeout: float, max_boot: float) -> float:
    """Seconds after the last worker became ready by which a worker fault must have raised:
    the loader's ``timeout=`` (or :data:`NOTICE_S`) plus a slack of max(10 s, 2 x the slowest boot)."""
    return (loader_timeout or NOTICE_S) + max(10.0, 2 * max_boot)


#: what a child-fault scenario reports of each state beside its judgement (seconds; ``tries``: runs it took)
CHILD_FAULT_MEASUREMENTS = ("loader_timeout", "tries", "elapsed", "since_ready", "max_boot", "total_s")

#: where each death state puts worker k's death, for the verdict (see probes.faults.DEATH_STATES)
STATE_TEXT = {
    None: "worker {k} died as soon as it booted",
    "in_start": "worker {k} died before its start() returned",
    "before_send": "worker {k} died after its start() returned, before the driver's next put",
    "while_waiting": "worker {k} died once the driver, having sent work, waited for a result",
}


def scenario_child_fault(loader: dict, context: str, fault: str, worker: int, num_workers: int,
                         parallelism: int | None, loader_timeout: float, boot_cost: float,
                         states: tuple = (None,)) -> dict[str, Any]:
    """One run of the fault per state of ``states`` (``probes.faults.DEATH_STATES``; None: the
    fault fires at boot), each judged on its own: ``{"states": [{"at": state, ...}, ...]}``."""
    under_test = scenarios.rebuild(loader, context)
    if loader_timeout:
        loader_timeout = hang_timeout(loader_timeout, context, num_workers, boot_cost)
    return {"states": [{"at": at, **_child_fault_tries(under_test, context, fault, worker, num_workers, parallelism,
                                                       loader_timeout, boot_cost, at)} for at in states]}


def _child_fault_tries(under_test, context: str, fault: str, worker: int, num_workers: int,
                       parallelism: int | None, loader_timeout: float, boot_cost: float, at) -> dict[str, Any]:
    before = LeakSnapshot.take()
    t0 = time.monotonic()
    for tries in range(1, HANG_TRIES + 1):
        out = _child_fault_once(under_test, context, fault, worker, num_workers, parallelism, loader_timeout,
                                boot_cost, before, at)
        if not out.pop("healthy_still_booting", False) or out.get("live_while_held") or out.get("leaks"):
            break
        # The timeout fired while a healthy worker still booted: the load rose since the boot cost
        # was measured (the loader timed out correctly). Inconclusive, so again with twice the timeout.
        loader_timeout = round(2 * loader_timeout, 1)
    out["tries"] = tries
    out["total_s"] = time.monotonic() - t0
    return out


def _child_fault_once(under_test, context: str, fault: str, worker: int, num_workers: int,
                      parallelism: int | None, loader_timeout: float, boot_cost: float, before,
                      at=None) -> dict[str, Any]:
    plan = getattr(FaultPlan, fault)(worker, **({"at": at} if at else {}))
    ctx = InstrumentedContext(context, num_workers=num_workers, faults=plan)
    dl = under_test.make(WorkerTagDataset(12), num_workers=num_workers, multiprocessing_context=ctx,
                  parallelism=parallelism, batch_size=2, timeout=loader_timeout)
    t0 = time.monotonic()

    def died(recs) -> bool:
        rec = _record(recs, worker)
        return fault == "child_hang" or (rec is not None and rec.pid is not None and is_dead(rec.pid))

    def overdue() -> str | None:
        # the bound the judge applies, checked while the loader runs: a loader that never raises
        # is stopped there, not at the runner's hard limit
        recs = ctx.records(0)
        ready = [r.ready for r in recs if r.ready is not None]
        if len(ready) < num_workers or not died(recs):
            return None  # a worker still boots, or the death waits for its state: the runner's limit bounds that
        boot = slowest_boot(recs)
        since, within = time.monotonic() - noticeable(recs), error_bound(loader_timeout, boot)
        if since <= within + OVERDUE_GRACE_S:
            return None
        return (f"no error {since:.0f} s after the last worker was ready or died, if later (bound {within:.0f} s: "
                f"timeout {loader_timeout or 'none'}, slowest boot {boot:.1f} s)")

    error = None
    try:
        with deadline("the epoch", None, overdue=overdue):
            for batch in dl:
                del batch  # a batch still referenced keeps its shm fd: not a leak
    except StepAborted as exc:
        with sigchld_ignored():  # a loader's SIGCHLD handler (torch's) would raise for the workers killed here
            kill_workers(ctx)
            ctx.close()
            return {"overdue": str(exc).splitlines()[0], "pids": {r.worker: r.pid for r in ctx.records(0)},
                    "placed": _placed(ctx, worker)}
    except Exception as exc:
        error = exc
    t_err = time.monotonic()
    recs = ctx.records(0)
    # Deadlines are measured from the last worker that became ready (or a death placed later),
    # not from iter(): other workers' boots (slow on a loaded machine) are not the loader's
    # wait. The slowest boot seen in this try widens the slack under load.
    since_ready = t_err - noticeable(recs, t0)
    pids = {r.worker: r.pid for r in recs}
    placed = _placed(ctx, worker)
    # a healthy worker not ready when the timeout could first fire: the loader may rightly have timed out on it
    healthy = {r.worker: r.ready for r in recs if r.worker != worker}
    still_booting = bool(loader_timeout and error is not None and (
        len(healthy) < num_workers - 1 or any(t is None or t - t0 > loader_timeout for t in healthy.values())))
    chain = describe_chain(error) if error is not None else []
    live = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost), kinds=("processes", "threads"))
    scenarios.stop_if_failed(live, ctx)  # before the error goes: its release starts the loader's shutdown
    error = None
    del dl
    gc.collect()
    after = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost)) if not live else None
    ctx.close()
    return {"raised": bool(chain), "chain": chain, "elapsed": t_err - t0, "pids": pids,
            "since_ready": since_ready, "max_boot": slowest_boot(recs),
            "live_while_held": live.format() if live else "", "live_summary": live.summary() if live else "",
            "leaks": after.format() if after else "",
            "leak_summary": scenarios.leak_summary(after), "loader_timeout": loader_timeout,
            "healthy_still_booting": still_booting, "placed": placed}


def _record(recs, worker: int):
    return next((r for r in recs if r.worker == worker), None)


def _placed(ctx, worker: int) -> bool:
    """Whether worker ``worker``'s death was placed at its state (always, for a death at boot)."""
    rec = _record(ctx.records(0), worker)
    return rec is not None and (rec.death_placed is not False)


#: why a state can go unreached (the verdict's note for it)
UNREACHED = {
    "in_start": "worker {k} did not exit within the placement patience after its start() returned",
    "before_send": "the driver put nothing through the context's Queue after starting worker {k}",
    "while_waiting": "the driver did not wait on the context's Queue after sending work while worker {k} waited",
}


def judge_child_fault(out: dict, worker: int, timeout: float | None = None,
                      note: Callable[[dict[str, str]], None] = lambda outcomes: None) -> None:
    """Judges each state's run (:func:`judge_child_fault_at`) and hands ``note`` each state's
    outcome (``passed``, ``failed: ...``, ``not reached: ...``) before the verdict. Fails naming
    every state that failed; skips if the loader reached none."""
    outcomes: dict[str, str] = {}
    failures = []
    for run in out["states"]:
        name = run["at"] or "boot"
        if not run["placed"]:
            outcomes[name] = "not reached: " + UNREACHED[name].format(k=worker)
            continue
        try:
            judge_child_fault_at(run, worker, timeout)
        except (AssertionError, pytest.fail.Exception) as exc:
            reason = str(getattr(exc, "msg", None) or exc)
            outcomes[name] = f"failed: {reason.splitlines()[0]}"
            failures.append(f"at {name} ({STATE_TEXT[run['at']].format(k=worker)}): {reason}")
        else:
            outcomes[name] = "passed"
    note(outcomes)
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
    if not any(v == "passed" for v in outcomes.values()):
        pytest.skip("no state was reached: " + "; ".join(f"{k}: {v}" for k, v in outcomes.items()))


def judge_child_fault_at(out: dict, worker: int, timeout: float | None = None) -> None:
    """``timeout``: the loader's ``timeout=`` asked for (under spawn the scenario raises it
    to cover worker 0's boot); the error must come within the timeout given plus
    a slack of max(10 s, 2 x the slowest boot measured in this scenario), counted
    from the moment the last worker became ready."""
    if timeout is not None:
        timeout = out.get("loader_timeout", timeout)
    if "overdue" in out:
        pytest.fail(f"the loader gave no error although worker {worker} failed during start: {out['overdue']}",
                    pytrace=False)
    if not out["raised"]:
        pytest.fail(f"the loader finished without an error although worker {worker} died during start",
                    pytrace=False)
    text = " | ".join(out["chain"])
    pid = out["pids"].get(str(worker)) or out["pids"].get(worker)
    names = [f"worker {worker}", f"worker process {worker}"] + ([str(pid)] if pid else [])
    assert any(n in text for n in names), f"the error does not name worker {worker} (pid {pid}): {text[:400]}"
    assert not out["live_while_held"], (
        f"while the error is held (the leak rule): {out.get('live_summary') or 'processes or threads'} of the "
        f"loader still alive:\n{out['live_while_held']}")
    if timeout is not None:
        within = error_bound(timeout, out["max_boot"])
        assert out["since_ready"] <= within, (
            f"the error came {out['since_ready']:.1f} s after the last worker was ready or died, if later "
            f"({out['elapsed']:.1f} s "
            f"after iter()); bound {within:.1f} s = timeout {timeout} s + slack (slowest boot {out['max_boot']:.1f} s)"
            + (f"; try {out['tries']}: the earlier timed out while a healthy worker still booted"
               if out.get("tries", 1) > 1 else ""))
    assert not out["leaks"], f"leaked after the error: {out['leak_summary']}\n{out['leaks']}"
