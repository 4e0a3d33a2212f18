"""Kill the process that drives a loader and watch what it leaves behind.

The scenario process (own session) builds the loader and reports readiness;
the parent walks its process tree *before* the kill (pids plus create times,
so a reused pid is never mistaken for a survivor), kills it with SIGKILL or
lets it ``os._exit(0)``, then polls until every recorded process, and every
later member of its session, is gone, or the bound passes and the survivors make no
progress to exit (none used CPU or went in :data:`PROGRESS_WINDOW_S`), or
:data:`LATE_EXIT_BOUNDS` bounds pass. The ``/dev/shm``
entries that tree mapped or held open at the kill (see
:func:`~pytest_workerstart.probes.shm.attributed_shm`) must be gone too.
Survivors are listed with pid, cmdline and age, then killed; of the leftover
shm entries only those attributed to the tree are unlinked, never another
job's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil

from pytest_workerstart.harness import reaper
from pytest_workerstart.harness.cleanup import kill_tree
from pytest_workerstart.harness.reaper import kill_session, session_members
from pytest_workerstart.harness.runner import check_abort, launch
from pytest_workerstart.probes import proc_start
from pytest_workerstart.probes.leaks import ProcInfo, alive
from pytest_workerstart.probes.shm import attributed_shm


@dataclasses.dataclass
class DriverDeathResult:
    ok: bool
    setup_error: str | None
    recorded: list[ProcInfo]
    survivors: list[tuple[ProcInfo, float]]  # (process, age in s)
    shm_left: list[str]
    gone_after_s: float | None
    #: the points of the loaders the driver built (it says them when ready)
    built: list[str] = dataclasses.field(default_factory=list)

    def report(self) -> str:
        if self.setup_error:
            return f"scenario did not reach the kill point: {self.setup_error}"
        lines = []
        for info, age in self.survivors:
            lines.append(f"  survivor: pid {info.pid} age {age:.0f} s: {info.cmdline[:200]}")
        for name in self.shm_left:
            lines.append(f"  /dev/shm left: {name}")
        return "\n".join(lines) or "  (nothing left)"


#: Past the bound, survivors still exiting (below) are watched up to this many bounds in all
LATE_EXIT_BOUNDS = 3
#: how long survivors are watched for progress between two looks, past the bound
PROGRESS_WINDOW_S = 2.0


def _cpu_seconds(infos: list[ProcInfo]) -> dict[tuple[int, float], float]:
    out = {}
    for i in infos:
        try:
            t = psutil.Process(i.pid).cpu_times()
        except psutil.Error:
            continue
        out[(i.pid, i.started)] = t.user + t.system
    return out


def _still_exiting(before: dict[tuple[int, float], float], survivors: list[ProcInfo]) -> bool:
    """Whether survivors seen ``PROGRESS_WINDOW_S`` ago made progress since: fewer of them, or one
    used CPU (an interpreter tearing down torch does; one blocked on a dead peer does not)."""
    now = _cpu_seconds(survivors)
    return len(now) < len(before) or any(now.get(k, 0.0) > v for k, v in before.items())


def _existing(names: set[str]) -> list[str]:
    return sorted(n for n in names if os.path.exists(f"/dev/shm/{n}"))


def _alive(info: ProcInfo) -> bool:
    try:
        return proc_start.started(info.pid) == info.started and alive(psutil.Process(info.pid))
    except psutil.Error:
        return False


def _info(p: psutil.Process) -> ProcInfo | None:
    try:
        start = proc_start.started(p.pid)
        if start is None:
            return None
        with p.oneshot():
            return ProcInfo(p.pid, start, " ".join(p.cmdline()), p.status())
    except psutil.Error:
        return None


def run_driver_death(target: str, kwargs: dict, *, exit_mode: str, bound: float = 15.0,
                     ready_timeout: float = 120.0, env: dict | None = None, warm: bool = False) -> DriverDeathResult:
    """``exit_mode``: ``sigkill`` or ``exit`` (``os._exit(0)`` inside the driver); ``warm``:
    the driver is forked from the zygote (:func:`~pytest_workerstart.harness.runner.launch`)."""
    if exit_mode not in ("sigkill", "exit"):
        raise ValueError(f"exit_mode must be 'sigkill' or 'exit', got {exit_mode!r}")
    workdir = Path(tempfile.mkdtemp(prefix="workerstart-driver-"))
    ready, go = workdir / "ready", workdir / "go"
    ours: set[str] = set()  # /dev/shm entries attributed to the scenario's tree
    proc = launch(workdir, target, {**kwargs, "ready_path": str(ready), "go_path": str(go)}, env, warm=warm)
    leader_ctime = reaper.register_session(proc.pid)
    recorded: list[ProcInfo] = []
    try:
        deadline = time.monotonic() + ready_timeout
        while not ready.exists():
            check_abort()
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "exited early" if proc.poll() is not None else f"not ready within {ready_timeout:.0f} s"
                tail = (workdir / "stderr.txt").read_text(errors="replace")[-3000:]
                try:
                    result = json.loads((workdir / "result.json").read_text())
                    tail = result.get("traceback") or result.get("error") or tail
                except (OSError, ValueError):
                    pass
                return DriverDeathResult(False, f"{why}\n{tail}", [], [], [], None)
            time.sleep(0.05)
        try:
            built = json.loads(ready.read_text()).get("built", [])
        except (OSError, ValueError, AttributeError):
            built = []
        time.sleep(0.2)  # let the tree settle (a start may be returning)
        tree = [psutil.Process(proc.pid)]
        try:
            tree += tree[0].children(recursive=True)
        except psutil.Error:
            pass
        tree += [p for p in session_members(proc.pid, leader_ctime) if p.pid not in {t.pid for t in tree}]
        recorded += [i for i in (_info(p) for p in tree) if i is not None]
        ours |= attributed_shm(i.pid for i in recorded)
        killed_at = time.monotonic()
        if exit_mode == "sigkill":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            go.write_text("go")
        proc.wait(timeout=30)
        survivors: list[ProcInfo] = []
        gone_after = None
        # Past the bound the judgement is what the survivors do, not the clock: a process that
        # noticed the driver's death and is still exiting (a poll of its own near the bound, a
        # machine under load) is watched on; one that makes no progress has not noticed, or waits
        # on the dead driver, and is killed by the suite.
        watched: dict[tuple[int, float], float] | None = None
        next_look = 0.0
        while True:
            late = [i for i in (_info(p) for p in session_members(proc.pid, leader_ctime)) if i is not None]
            known = {(i.pid, i.started) for i in recorded}
            recorded += [i for i in late if (i.pid, i.started) not in known]
            survivors = [i for i in recorded if i.pid != proc.pid and _alive(i)]
            ours |= attributed_shm(i.pid for i in survivors)
            shm_left = _existing(ours)
            if not survivors and not shm_left:
                gone_after = time.monotonic() - killed_at
                break
            since = time.monotonic() - killed_at
            if since > bound and time.monotonic() >= next_look:
                if shm_left and not survivors:
                    break  # nothing left that could still unlink them
                if since > LATE_EXIT_BOUNDS * bound or (watched is not None and not _still_exiting(watched,
                                                                                                  survivors)):
                    break
                watched, next_look = _cpu_seconds(survivors), time.monotonic() + PROGRESS_WINDOW_S
            time.sleep(0.2)
        now = proc_start.now()
        result = DriverDeathResult(
            ok=not survivors and not shm_left, setup_error=None, recorded=recorded,
            survivors=[(i, now - i.started) for i in survivors], shm_left=shm_left, gone_after_s=gone_after,
            built=built)
        return result
    finally:
        kill_tree([i for i in recorded if i.pid != proc.pid])
        kill_session(proc.pid, leader_ctime=leader_ctime)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reaper.unregister_session(proc.pid)
        for name in _existing(ours):
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass
        shutil.rmtree(workdir, ignore_errors=True)  # its TMPDIR (harness.runner.launch) included
