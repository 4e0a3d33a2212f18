"""``failure.forkserver_died``: the forkserver is killed between epochs; the next epoch
starts a new one or raises, and does not hang (the hang is the runner's bound).

Runs in a fresh interpreter; imports only what the rooms' rule allows (:mod:`pytest_workerstart.conformance`).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from pytest_workerstart import scenarios
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.probes.leaks import alive, helpers


def scenario_forkserver_died(loader: dict, context: str, persistent: bool, num_workers: int,
                             parallelism: int | None) -> dict[str, Any]:
    """One epoch, SIGKILL to the forkserver, then the next epoch (timed; its hang is the runner's)."""
    under_test = scenarios.rebuild(loader, context)
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
