"""How much of the machine's CPU other processes used while we measured.

Speed checks compare configurations side by side, but on a machine whose CPUs
other jobs keep busy the comparison says nothing about the loader (concurrent
boots that share the CPU with them all finish late together). So the CPU time
the machine spent, minus what this process tree spent, over the measurement's
wall time, tells whether a measurement can be judged at all.
"""

from __future__ import annotations

import dataclasses
import time

import psutil

#: Above this share of all CPUs used by other processes, a speed measurement is void.
BUSY_SHARE = 0.25


def tree_cpu_s() -> float:
    """CPU seconds of this process, its reaped children, its live descendants and what
    they reaped (the zygote reaps the scenarios it forked): what a speed trial charges
    its loader, and what is not foreign here."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
        except psutil.Error:
            continue
    return total


def _machine() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f) for f in ("user", "nice", "system", "irq", "softirq", "steal") if hasattr(t, f))


@dataclasses.dataclass
class ForeignCPU:
    """``with ForeignCPU() as f: ...`` then ``f.share``: other processes' share of all CPUs."""

    share: float = 0.0
    cpus: int = 1

    def __enter__(self) -> ForeignCPU:
        self.cpus = psutil.cpu_count() or 1
        self._t0, self._m0, self._o0 = time.monotonic(), _machine(), tree_cpu_s()
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.monotonic() - self._t0, 1e-6)
        # live descendants that exited meanwhile and were not reaped by us are lost
        # from "ours" and counted as foreign: the estimate errs towards "busy"
        foreign = (_machine() - self._m0) - (tree_cpu_s() - self._o0)
        self.share = max(0.0, foreign / (wall * self.cpus))

    @property
    def busy(self) -> bool:
        return self.share > BUSY_SHARE

    def describe(self) -> str:
        return (f"other processes used {100 * self.share:.0f}% of the {self.cpus} CPUs "
                f"(more than {100 * BUSY_SHARE:.0f}%)")


def sample(seconds: float = 2.0) -> ForeignCPU:
    """Other processes' CPU share over the next ``seconds`` (this tree idle)."""
    with ForeignCPU() as f:
        time.sleep(seconds)
    return f
