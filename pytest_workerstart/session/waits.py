"""How long the suite waits on a loader: the per-check hard limit and the per-step deadlines,
in units of what one spawn worker's boot costs in this run."""

from __future__ import annotations

from pytest_workerstart.probes.deadline import measure_boot_cost
from pytest_workerstart.settings import Settings

#: Per-check hard limit (pytest-timeout) unless the check sets its own: the
#: last resort behind the per-step deadlines (see ``Waits.step_timeout``).
CHECK_TIMEOUT_S = 300
#: Step deadline = max(STEP_FLOOR_S, STEP_BASE_S + STEP_BOOTS x boot cost x num_workers):
#: a serial start pays one boot per worker; 3x leaves room for a loaded machine.
STEP_FLOOR_S, STEP_BASE_S, STEP_BOOTS = 20.0, 10.0, 3.0
#: Hard limit of the preflight scenario unless --workerstart-step-timeout is given.
PREFLIGHT_TIMEOUT_S = 60.0


class Waits:
    """The run's wait policy; the boot cost comes from the preflight, or is measured when first asked."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.boot_cost: float | None = None  # seconds

    def step_timeout(self, num_workers: int) -> float:
        """Seconds one in-process step that waits on the loader may take."""
        if self.settings.step_timeout is not None:
            return self.settings.step_timeout
        return max(STEP_FLOOR_S, STEP_BASE_S + STEP_BOOTS * self.measured_boot_cost() * max(1, num_workers))

    def measured_boot_cost(self) -> float:
        """Seconds one spawn worker's boot takes in this run: the unit of every derived wait."""
        if self.boot_cost is None:
            self.boot_cost = measure_boot_cost()
        return self.boot_cost

    def preflight_timeout(self) -> float:
        return self.settings.step_timeout or PREFLIGHT_TIMEOUT_S
