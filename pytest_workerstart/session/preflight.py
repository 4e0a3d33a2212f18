"""The preflight: build the loader and fetch one batch in a scenario process, before any check.

A loader that cannot do that (rejects the suite's datasets, raises, hangs, crashes the driver)
would fail every check the same way, slowly: the run stops with one line instead, and a verdict
that says why nothing ran. It also measures the boot cost every derived wait is a multiple of.
"""

from __future__ import annotations

import gc
import re
import sys
import time
from typing import Any

from pytest_workerstart import protocol, scenarios
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.harness.runner import ScenarioResult
from pytest_workerstart.harness.zygote import import_cost

ADAPTER_DOCS = "docs/adapter.md"
NUM_WORKERS = 2


def scenario_preflight(loader: dict, context: str, num_workers: int, parallelism: int | None) -> dict[str, Any]:
    """In the scenario process: build the loader on a tiny suite dataset and fetch one batch.

    Also measures the import of torch and the loader in a fresh interpreter: what
    a spawn worker pays to boot, the unit of every in-process deadline (forked from
    the zygote, torch's share is the zygote's own fresh import).
    """
    import faulthandler

    faulthandler.enable(sys.stderr)  # a crash of the driver then says where (failure_site)
    t0 = time.monotonic()
    under_test = scenarios.rebuild(loader, context)
    boot = time.monotonic() - t0 + import_cost()

    dl = under_test.make(WorkerTagDataset(8), num_workers=num_workers, multiprocessing_context=context,
                         parallelism=parallelism, batch_size=2)
    it = iter(dl)
    next(it)
    del it, dl
    gc.collect()
    return {"boot_s": boot}


def run(loader: protocol.LoaderUnderTest, context: str, *, timeout: float,
        memory_limit: int | None) -> ScenarioResult:
    parallelism = 2 if loader.has("parallel_start", context) else None
    return scenarios.run(loader, context, f"{__name__}:scenario_preflight", timeout=timeout,
                         num_workers=NUM_WORKERS, parallelism=parallelism, memory_limit=memory_limit, warm=True)


def failure_lines(loader: protocol.LoaderUnderTest, context: str, res: ScenarioResult,
                  timeout: float) -> list[str]:
    """What the run says when the preflight failed: the problem, where, and the fix (empty: it passed)."""
    kwarg = loader.parallelism_kwarg if loader.has("parallel_start", context) else None
    problem = problem_of(res, timeout, kwarg)
    if problem is None:
        return []
    lines = [f"workerstart: preflight: loader {loader.spec} ({loader.qualname}, {context}, "
             f"num_workers={NUM_WORKERS}): {problem}"]
    site = failure_site(res)
    if site is not None:
        lines.append(f"workerstart: where: {site}")
    lines.append(f"workerstart: fix: the loader must build from the suite's dataset and "
                 f"deliver a batch: {ADAPTER_DOCS} says how to adapt one")
    return lines


def not_run_reason(lines: list[str]) -> str:
    """The verdict's reason why no check ran, from :func:`failure_lines`."""
    return f"{lines[0].removeprefix('workerstart: ')}; no check ran. How to adapt a loader: {ADAPTER_DOCS}"


def problem_of(res: ScenarioResult, timeout: float, kwarg: str | None = None) -> str | None:
    """One line saying why the preflight failed, or None."""
    if res.status == "ok":
        return None
    if res.status == "error" and protocol.forwarded_keyword(res.error, kwarg):
        return (f"it does not take the parallelism keyword {kwarg!r} but passes it on "
                f"({res.error.splitlines()[0][:300]}); give the keyword it consumes with "
                "--workerstart-parallelism-kwarg=NAME, or none")
    if res.status == "error":
        return f"building it and fetching one batch raised {res.error.splitlines()[0][:400]}"
    if res.status == "hang":
        return f"it hung: no first batch within {timeout:.0f} s (building it, iter() or next())"
    if res.status == "memory":
        return f"it ran away with memory while building it or fetching one batch: {res.error}"
    code = res.returncode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
    return f"the process driving it {how} while building it or fetching one batch (a crash of the driver)"


def failure_site(res: ScenarioResult) -> str | None:
    """Where the loader failed, in one line: the frame that raised its exception, or a crash's
    or hang's fatal error and innermost frame (None: nothing to show)."""
    frame = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
    if res.status == "error":
        frames = frame.findall(res.traceback or "")
        return f"raised at {frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else None
    text = res.stacks or res.stderr or ""
    fatal = re.search(r"Fatal Python error: (.+)", text)
    frames = frame.findall(text.split("most recent call first", 1)[-1])
    parts = [fatal.group(1).strip()] if fatal else []
    if frames:
        parts.append(f"innermost frame {frames[0][0]}:{frames[0][1]} in {frames[0][2]}")
    return "; ".join(parts) or None
