"""``failure.interrupt_during_start``: Ctrl-C while workers start raises KeyboardInterrupt in
the caller, and no worker is left running while the caller holds it.

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from pytest_workerstart import scenarios
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.probes.leaks import LeakSnapshot, patience


def scenario_interrupt(loader: dict, context: str, worker: int, num_workers: int,
                       parallelism: int | None, boot_cost: float) -> dict[str, Any]:
    under_test = scenarios.rebuild(loader, context)
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
    scenarios.stop_if_failed(live, ctx)  # before the error goes: its release starts the loader's shutdown
    holder.clear()
    del dl
    gc.collect()
    after = LeakSnapshot.wait_clean(before, timeout=patience(boot_cost)) if not live else None
    ctx.close()
    return {"raised": raised, "began": began, "detail": detail, "live_while_held": live.format() if live else "",
            "live_summary": live.summary() if live else "",
            "held_only": while_held.only(("fds", "shm")).summary() if while_held else "",
            "leaks": after.format() if after else "", "leak_summary": scenarios.leak_summary(after)}


def _start_began(ctx, worker: int) -> bool:
    return any(r.worker == worker and r.start_begin is not None for r in ctx.records())


def judge_interrupt(out: dict, strict: bool = False) -> None:
    if not out["raised"] and not out.get("began", True):
        pytest.fail("the start of the worker that sends the SIGINT never began within 60 s of the first batch: "
                    "the interrupt could not be exercised", pytrace=False)
    assert out["raised"] == ["KeyboardInterrupt"], (
        f"expected KeyboardInterrupt, got {out['raised'] or 'nothing'}\n{out.get('detail', '')}")
    assert not out["live_while_held"], (
        f"while the KeyboardInterrupt is held: {out.get('live_summary') or 'processes or threads'} of the loader "
        f"still alive:\n{out['live_while_held']}")
    assert not out["leaks"], f"leaked after Ctrl-C during start: {out['leak_summary']}\n{out['leaks']}"
    if strict and out["held_only"] and out["held_only"] != "nothing":
        pytest.fail(f"held only by the referenced KeyboardInterrupt: {out['held_only']} (strict mode)", pytrace=False)
