"""``failure.driver_killed``: the process driving the loader, killed at a point, here (the
killing and the judging are :mod:`pytest_workerstart.harness.driver_death`'s).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import os
import time

from pytest_workerstart import scenarios, space
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.probes.context import InstrumentedContext
from pytest_workerstart.probes.faults import FaultPlan


def scenario_driver(loader: dict, context: str, case: str, num_workers: int, parallelism: int | None,
                    ready_path: str, go_path: str) -> None:
    """Drive the loader to the kill point, say so, then wait to be killed.

    ``case``: ``after_first_batch``, or ``mid_start`` (the last worker's
    ``start()`` is delayed 10 minutes, so the kill lands while it starts).
    """
    import json
    import threading
    from pathlib import Path

    under_test = scenarios.rebuild(loader, context)
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
