"""Scenarios that run in a fresh interpreter (see :mod:`.harness.runner`).

Each ``scenario_*`` function runs in the child, rebuilds the loader from its
SPEC, drives it, and returns plain JSON. The ``judge_*`` functions run in
pytest and turn that JSON into a verdict. Anything that might hang forever or
kill the driver belongs here, so pytest itself can never be the casualty.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

import pytest

from pytest_workerstart.harness.cleanup import kill_workers
from pytest_workerstart.harness.runner import ScenarioResult, run_scenario
from pytest_workerstart.probes.faults import describe_chain


def child_env() -> dict[str, str]:
    """The child must import what pytest could (rootdir/conftest sys.path entries)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}


def run(loader, context: str, name: str, *, timeout: float, memory_limit: int | None = None,
        exit_grace: float = 0.0, warm: bool = False, **kwargs) -> ScenarioResult:
    """Run ``scenario_<name>`` of this module (or ``name`` = "module:function") for
    ``loader`` (a LoaderUnderTest) in ``context``, bounded by ``timeout`` seconds
    and ``memory_limit`` bytes of resident memory (the runner's default if None);
    ``exit_grace``, ``warm``: see :func:`~pytest_workerstart.harness.runner.run_scenario`."""
    target = name if ":" in name else f"{__name__}:scenario_{name}"
    return run_scenario(target, {"loader": loader.payload(), "context": context, **kwargs},
                        timeout=timeout, env=child_env(), memory_limit=memory_limit, exit_grace=exit_grace, warm=warm)


def planned(env, name: str, *, timeout: float, exit_grace: float = 0.0, warm: bool = True, **kwargs):
    """What a check's ``@planned_scenario`` plan returns: :func:`run` of ``scenario_<name>``
    for ``env``'s loader and context, bounded by the scenario share of the memory limit,
    forked from the zygote unless ``warm=False`` (a truly fresh interpreter)."""
    import functools

    return functools.partial(run, env.loader, env.context_name, name, timeout=timeout,
                             memory_limit=env.scenario_memory_limit, exit_grace=exit_grace, warm=warm, **kwargs)


def value_of(res: ScenarioResult) -> Any:
    """The scenario's return value; the check fails with the details if it did not return."""
    if res.status != "ok":
        pytest.fail(res.details(), pytrace=False)
    return res.value


def rebuild(loader: dict, context: str):
    """In the scenario process: the loader under test from its payload; multiprocessing's
    forkserver gets the suite's preload list if the loader ever starts it."""
    from pytest_workerstart import protocol
    from pytest_workerstart.probes.context import warm_forkserver

    built = protocol.from_payload(loader)
    if context == "forkserver":
        warm_forkserver(start=False)
    return built


# --- child faults during start ----------------------------------------------


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


def error_bound(loader_timeout: float, max_boot: float) -> float:
    """Seconds after the last worker became ready by which a worker fault must have raised:
    the loader's ``timeout=`` (or :data:`NOTICE_S`) plus a slack of max(10 s, 2 x the slowest boot)."""
    return (loader_timeout or NOTICE_S) + max(10.0, 2 * max_boot)


#: what a child-fault scenario reports beside its judgement (seconds; ``tries``: runs it took)
CHILD_FAULT_MEASUREMENTS = ("loader_timeout", "tries", "elapsed", "since_ready", "max_boot", "total_s")


def scenario_child_fault(loader: dict, context: str, fault: str, worker: int, num_workers: int,
                         parallelism: int | None, loader_timeout: float, boot_cost: float) -> dict[str, Any]:
    from pytest_workerstart.probes.leaks import LeakSnapshot

    under_test = rebuild(loader, context)
    if loader_timeout:
        loader_timeout = hang_timeout(loader_timeout, context, num_workers, boot_cost)
    before = LeakSnapshot.take()
    t0 = time.monotonic()
    for tries in range(1, HANG_TRIES + 1):
        out = _child_fault_once(under_test, context, fault, worker, num_workers, parallelism, loader_timeout,
                                boot_cost, before)
        if not out.pop("healthy_still_booting", False) or out.get("live_while_held") or out.get("leaks"):
            break
        # The timeout fired while a healthy worker still booted: the load rose since the boot cost
        # was measured (the loader timed out correctly). Inconclusive, so again with twice the timeout.
        loader_timeout = round(2 * loader_timeout, 1)
    out["tries"] = tries
    out["total_s"] = time.monotonic() - t0
    return out


def _child_fault_once(under_test, context: str, fault: str, worker: int, num_workers: int,
                      parallelism: int | None, loader_timeout: float, boot_cost: float, before) -> dict[str, Any]:
    from pytest_workerstart.fixtures.datasets import WorkerTagDataset
    from pytest_workerstart.probes.context import InstrumentedContext
    from pytest_workerstart.probes.faults import FaultPlan
    from pytest_workerstart.probes.leaks import LeakSnapshot, patience

    plan = getattr(FaultPlan, fault)(worker)
    ctx = InstrumentedContext(context, num_workers=num_workers, faults=plan)
    dl = under_test.make(WorkerTagDataset(12), num_workers=num_workers, multiprocessing_context=ctx,
                  parallelism=parallelism, batch_size=2, timeout=loader_timeout)
    t0 = time.monotonic()

    def overdue() -> str | None:
        # the bound the judge applies, checked while the loader runs: a loader that never raises
        # is stopped there, not at the runner's hard limit
        recs = ctx.records(0)
        ready = [r.ready for r in recs if r.ready is not None]
        if len(ready) < num_workers:
            return None  # a worker still boots: the runner's limit bounds that
        boot = slowest_boot(recs)
        since, within = time.monotonic() - max(ready), error_bound(loader_timeout, boot)
        return (f"no error {since:.0f} s after the last worker was ready (bound {within:.0f} s: timeout "
                f"{loader_timeout or 'none'}, slowest boot {boot:.1f} s)") if since > within + OVERDUE_GRACE_S else None

    from pytest_workerstart.probes.deadline import StepAborted, deadline

    error = None
    try:
        with deadline("the epoch", None, overdue=overdue):
            for batch in dl:
                del batch  # a batch still referenced keeps its shm fd: not a leak
    except StepAborted as exc:
        from pytest_workerstart.harness.reaper import sigchld_ignored

        with sigchld_ignored():  # a loader's SIGCHLD handler (torch's) would raise for the workers killed here
            kill_workers(ctx)
            ctx.close()
            return {"overdue": str(exc).splitlines()[0], "pids": {r.worker: r.pid for r in ctx.records(0)}}
    except Exception as exc:
        error = exc
    t_err = time.monotonic()
    recs = ctx.records(0)
    pids = {r.worker: r.pid for r in recs}
    # Deadlines are measured from the last worker that became ready, not from
    # iter(): other workers' boots (slow on a loaded machine) are not the
    # loader's wait. The slowest boot seen in this try widens the slack under load.
    ready = [r.ready for r in recs if r.ready is not None]
    # a healthy worker not ready when the timeout could first fire: the loader may rightly have timed out on it
    healthy = {r.worker: r.ready for r in recs if r.worker != worker}
    still_booting = bool(loader_timeout and error is not None and (
        len(healthy) < num_workers - 1 or any(t is None or t - t0 > loader_timeout for t in healthy.values())))
    chain = describe_chain(error) if error is not None else []
    live = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost), kinds=("processes", "threads"))
    _stop_if_failed(live, ctx)  # before the error goes: its release starts the loader's shutdown
    error = None
    del dl
    gc.collect()
    after = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost)) if not live else None
    ctx.close()
    return {"raised": bool(chain), "chain": chain, "elapsed": t_err - t0, "pids": pids,
            "since_ready": t_err - max(ready, default=t0), "max_boot": slowest_boot(recs),
            "live_while_held": live.format() if live else "", "leaks": after.format() if after else "",
            "leak_summary": _summary(after), "loader_timeout": loader_timeout,
            "healthy_still_booting": still_booting}


def _summary(after) -> str:
    return after.summary() if after is not None else "not judged: processes were alive while the error was held"


def _stop_if_failed(live, ctx) -> None:
    """The leak rule failed while the error was held, so the judge reads nothing after it:
    kill the loader's workers rather than wait out its own shutdown (torch joins each for 5 s)."""
    if live:
        from pytest_workerstart.harness.reaper import sigchld_ignored

        with sigchld_ignored():  # a loader's SIGCHLD handler (torch's) would raise for the workers killed here
            kill_workers(ctx)


def judge_child_fault(out: dict, worker: int, timeout: float | None = None) -> None:
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
        f"while the error is held (the leak rule): processes or threads of the loader are still alive:\n"
        f"{out['live_while_held']}")
    if timeout is not None:
        within = error_bound(timeout, out["max_boot"])
        assert out["since_ready"] <= within, (
            f"the error came {out['since_ready']:.1f} s after the last worker was ready ({out['elapsed']:.1f} s "
            f"after iter()); bound {within:.1f} s = timeout {timeout} s + slack (slowest boot {out['max_boot']:.1f} s)"
            + (f"; try {out['tries']}: the earlier timed out while a healthy worker still booted"
               if out.get("tries", 1) > 1 else ""))
    assert not out["leaks"], f"leaked after the error: {out['leak_summary']}\n{out['leaks']}"


# --- Ctrl-C while workers start ------------------------------------------------


def scenario_forkserver_died(loader: dict, context: str, persistent: bool, num_workers: int,
                             parallelism: int | None) -> dict[str, Any]:
    """One epoch, SIGKILL to the forkserver, then the next epoch (timed; its hang is the runner's)."""
    from pytest_workerstart.fixtures.datasets import WorkerTagDataset
    from pytest_workerstart.probes.leaks import alive, helpers

    under_test = rebuild(loader, context)
    kw = {"persistent_workers": True} if persistent else {}
    dl = under_test.make(WorkerTagDataset(4 * num_workers), num_workers=num_workers, multiprocessing_context=context,
                         parallelism=parallelism, batch_size=2, **kw)
    out: dict[str, Any] = {"first": [int(i) for b in dl for i in b["index"]]}
    servers = helpers("multiprocessing.forkserver")
    out["servers"] = [p.pid for p in servers]
    for p in servers:
        p.kill()
    # Dead but not reaped: multiprocessing's ensure_running() waitpid()s its own server to
    # learn that it died; reaping it here would make that fail, by the test's fault.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in servers):
        time.sleep(0.02)
    t0 = time.monotonic()
    try:
        out["second"] = [int(i) for b in dl for i in b["index"]]
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["elapsed_s"] = time.monotonic() - t0
    del dl
    gc.collect()
    return out


def scenario_interrupt(loader: dict, context: str, worker: int, num_workers: int,
                       parallelism: int | None, boot_cost: float) -> dict[str, Any]:
    from pytest_workerstart.fixtures.datasets import WorkerTagDataset
    from pytest_workerstart.probes.context import InstrumentedContext
    from pytest_workerstart.probes.faults import FaultPlan
    from pytest_workerstart.probes.leaks import LeakSnapshot, patience

    under_test = rebuild(loader, context)
    before = LeakSnapshot.take()
    # Later workers start slowly so the interrupt lands while starts are in flight.
    plan = FaultPlan.interrupt(worker) + FaultPlan.start_delay({w: 0.5 for w in range(worker + 1, num_workers)})
    ctx = InstrumentedContext(context, num_workers=num_workers, faults=plan)
    dl = under_test.make(WorkerTagDataset(12), num_workers=num_workers, multiprocessing_context=ctx,
                  parallelism=parallelism, batch_size=2)
    holder: list = []
    try:
        next(iter(dl))
        # The first batch can come before worker ``worker``'s start even began (worker 0
        # is enough for it; under load a start thread may not have run yet): wait for
        # the start that sends the SIGINT, then give the KeyboardInterrupt time to land.
        deadline = time.monotonic() + 60
        while not _start_began(ctx, worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
    except BaseException as exc:
        holder.append(exc)
    began = _start_began(ctx, worker)
    raised = [f"{type(e).__name__}" for e in holder]
    detail = "".join(__import__("traceback").format_exception(holder[0]))[-3000:] if holder else ""
    live = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost), kinds=("processes", "threads"))
    while_held = before.diff(LeakSnapshot.take())
    _stop_if_failed(live, ctx)  # before the error goes: its release starts the loader's shutdown
    holder.clear()
    del dl
    gc.collect()
    after = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost)) if not live else None
    ctx.close()
    return {"raised": raised, "began": began, "detail": detail, "live_while_held": live.format() if live else "",
            "held_only": while_held.only(("fds", "shm")).summary() if while_held else "",
            "leaks": after.format() if after else "", "leak_summary": _summary(after)}


def _start_began(ctx, worker: int) -> bool:
    return any(r.worker == worker and r.start_begin is not None for r in ctx.records())


def judge_interrupt(out: dict, strict: bool = False) -> None:
    if not out["raised"] and not out.get("began", True):
        pytest.fail("the start of the worker that sends the SIGINT never began within 60 s of the first batch: "
                    "the interrupt could not be exercised", pytrace=False)
    assert out["raised"] == ["KeyboardInterrupt"], (
        f"expected KeyboardInterrupt, got {out['raised'] or 'nothing'}\n{out.get('detail', '')}")
    assert not out["live_while_held"], f"while the KeyboardInterrupt is held:\n{out['live_while_held']}"
    assert not out["leaks"], f"leaked after Ctrl-C during start: {out['leak_summary']}\n{out['leaks']}"
    if strict and out["held_only"] and out["held_only"] != "nothing":
        pytest.fail(f"held only by the referenced KeyboardInterrupt: {out['held_only']} (strict mode)", pytrace=False)


# --- the driver dies --------------------------------------------------------


def scenario_driver(loader: dict, context: str, case: str, num_workers: int, parallelism: int | None,
                    ready_path: str, go_path: str) -> None:
    """Drive the loader to the kill point, say so, then wait to be killed.

    ``case``: ``after_first_batch``, or ``mid_start`` (the last worker's
    ``start()`` is delayed 10 minutes, so the kill lands while it starts).
    """
    import json
    import threading
    from pathlib import Path

    from pytest_workerstart import space
    from pytest_workerstart.fixtures.datasets import WorkerTagDataset
    from pytest_workerstart.probes.context import InstrumentedContext
    from pytest_workerstart.probes.faults import FaultPlan

    under_test = rebuild(loader, context)
    ready, go = Path(ready_path), Path(go_path)

    def say_ready(at: str) -> None:  # with the points built: the driver is killed before it could return them
        tmp = ready.with_suffix(".tmp")
        tmp.write_text(json.dumps({"at": at, "built": space.recorded()}))
        os.replace(tmp, ready)

    def exit_on_go() -> None:  # the os._exit(0) variant
        while not go.exists():
            time.sleep(0.05)
        os._exit(0)

    threading.Thread(target=exit_on_go, daemon=True).start()
    plan = FaultPlan.start_delay({num_workers - 1: 600.0}) if case == "mid_start" else None
    ctx = InstrumentedContext(context, num_workers=num_workers, faults=plan)
    dl = under_test.make(WorkerTagDataset(64), num_workers=num_workers, multiprocessing_context=ctx,
                  parallelism=parallelism, batch_size=2)
    if case == "mid_start":
        def announce() -> None:
            while sum(r.start_end is not None for r in ctx.records(0)) < num_workers - 1:
                time.sleep(0.05)
            say_ready("mid-start")

        threading.Thread(target=announce, daemon=True).start()
        # blocks in the delayed start until killed; a loader whose __iter__ is a generator
        # (accelerate, mosaic) starts its workers at the first next(), not at iter()
        next(iter(dl))
    else:
        it = iter(dl)
        next(it)
        say_ready("after-first-batch")
    time.sleep(600)


# --- the interpreter's exit -------------------------------------------------

#: What a training script's module globals still hold when the interpreter exits.
_HELD_AT_EXIT: list = []


def scenario_clean_exit(loader: dict, context: str, ending: str, num_workers: int,
                        parallelism: int | None) -> dict[str, Any]:
    """Use the loader as a script does, then let the interpreter exit (judged from outside).

    ``exhaustion``: one epoch to the end. ``persistent``: two epochs with persistent
    workers (and ``pin_memory`` where an accelerator exists), the loader still
    referenced at exit. ``early_break``: ``for batch in loader: break``, the loader and
    the batch still referenced at exit. ``keyboard_interrupt``: Ctrl-C as a terminal
    sends it (SIGINT to the whole process group: driver and workers) in batch 2,
    caught by the script, which then ends.
    """
    import signal

    import torch

    from pytest_workerstart.fixtures.datasets import WorkerTagDataset

    under_test = rebuild(loader, context)
    kw: dict[str, Any] = {}
    if ending == "persistent":
        kw = {"persistent_workers": True, "pin_memory": torch.accelerator.is_available()}
    dl = under_test.make(WorkerTagDataset(16), num_workers=num_workers, multiprocessing_context=context,
                         parallelism=parallelism, batch_size=2, **kw)
    batches = 0
    if ending == "exhaustion":
        batches = sum(1 for _ in dl)
    elif ending == "persistent":
        for _epoch in range(2):
            for batch in dl:
                batches += 1
        _HELD_AT_EXIT.extend([dl, batch])
    elif ending == "early_break":
        for batch in dl:
            batches += 1
            break
        _HELD_AT_EXIT.extend([dl, batch])
    elif ending == "keyboard_interrupt":
        try:
            for batch in dl:
                batches += 1
                if batches == 2:
                    os.killpg(os.getpgrp(), signal.SIGINT)  # this scenario's own session only
                    time.sleep(30)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the SIGINT sent to the process group raised no KeyboardInterrupt")
    else:
        raise ValueError(f"unknown ending {ending!r}")
    return {"batches": batches}
