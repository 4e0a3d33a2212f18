"""Does a program that used the loader end cleanly? Run it in a fresh interpreter and see.

What users meet at the very end of a training script is only visible from
outside: the interpreter's exit status, what it (and everything it started:
workers, a forkserver, the resource tracker) wrote to stderr, such as
``resource_tracker: There appear to be 1 leaked semaphore objects to clean up
at shutdown`` or ``Exception ignored in: ...``, and whatever is still running
once it has gone. :func:`run_clean_exit` runs ``target(**kwargs)`` with the
scenario runner (own session, private ``TMPDIR``, hard timeout) and waits a
grace period after the interpreter exits before calling anything a leftover.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_workerstart.harness.runner import ScenarioResult, run_scenario


@dataclasses.dataclass
class CleanExit:
    """How the interpreter ended: status of the callable, exit status, stderr, leftover
    processes and ``/dev/shm`` entries."""

    result: ScenarioResult

    @property
    def stderr(self) -> str:
        return self.result.stderr

    def said(self, key: str) -> Any:
        """What the scenario returned under ``key`` (None where it returned nothing of the kind)."""
        return self.result.value.get(key) if isinstance(self.result.value, dict) else None

    @property
    def before_build(self) -> str:
        """What was written to stderr before the loader was first built (importing its packages):
        reported, not judged. Empty where the scenario did not say where its build began."""
        offset = self.said("stderr_before_build")
        return self.stderr.encode()[:offset].decode(errors="replace") if offset else ""

    @property
    def judged_stderr(self) -> str:
        """stderr from the loader's first build on (all of it where the build was not marked)."""
        return self.stderr.encode()[len(self.before_build.encode()):].decode(errors="replace")

    @property
    def leftovers(self) -> list[str]:
        return self.result.leftovers

    @property
    def shm_left(self) -> list[str]:
        return self.result.shm_left

    def problems(self) -> list[str]:
        """One line per way the exit was not clean (empty: it was)."""
        r = self.result
        if r.status != "ok":
            return [r.one_line() + (f": {r.traceback.strip().splitlines()[-1]}" if r.traceback else "")]
        out = []
        if r.returncode != 0:
            out.append(f"the interpreter exited with status {r.returncode}")
        if self.judged_stderr.strip():
            lines = self.judged_stderr.strip().splitlines()
            out.append(f"stderr is not empty ({len(lines)} lines): " + _first_and_last(lines))
        if r.leftovers:
            out.append(f"{len(r.leftovers)} processes outlived the interpreter: " + "; ".join(r.leftovers)[:600])
        if r.shm_left:
            out.append(f"{len(r.shm_left)} /dev/shm entries its processes created outlived it (unlinked by the "
                       "suite): " + ", ".join(r.shm_left)[:600])
        return out


#: lines of stderr a reason quotes from each end (a traceback's exception is its last line)
QUOTED_LINES = 3


def _first_and_last(lines: list[str]) -> str:
    """The first and the last lines, each end shortened on its own, within the 500 characters a
    verdict's reason keeps (:func:`pytest_workerstart.verdict.one_line`)."""
    if len(lines) <= 2 * QUOTED_LINES:
        return " | ".join(lines)[:360]
    return " | ".join(lines[:QUOTED_LINES])[:120] + " | ... | " + " | ".join(lines[-QUOTED_LINES:])[-240:]


def run_clean_exit(target: str, kwargs: dict | None = None, *, timeout: float = 120.0, exit_grace: float = 5.0,
                   env: dict[str, str] | None = None, memory_limit: int | None = None) -> CleanExit:
    """Run ``target(**kwargs)`` ("module:function") in a fresh interpreter that then exits normally."""
    return CleanExit(run_scenario(target, kwargs, timeout=timeout, env=env, memory_limit=memory_limit,
                                  exit_grace=exit_grace))
