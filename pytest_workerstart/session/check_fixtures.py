"""The fixtures the checks and ``check_env`` ask for, bound to one ``--workerstart`` run."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_workerstart import protocol
from pytest_workerstart.settings import Settings


class CheckFixtures:
    """A plugin of its own: ``run`` is the :class:`WorkerstartSession` whose loader, settings,
    waits and lookahead the fixtures hand out."""

    def __init__(self, run: Any):
        self._run = run
        self._from_fixture: tuple | None = None  # (what workerstart_loader returned, its LoaderUnderTest)

    @pytest.fixture
    def ws_loader(self, workerstart_loader) -> protocol.LoaderUnderTest:
        """The loader under test: the SPEC of the settings, or what a project's
        ``workerstart_loader`` fixture returns (resolved, and preflown, once)."""
        if workerstart_loader is None:
            return self._run.loader
        if self._from_fixture is None or self._from_fixture[0] is not workerstart_loader:
            try:
                loader = protocol.from_factory(workerstart_loader)
            except protocol.SpecError as exc:
                raise pytest.UsageError(f"workerstart_loader fixture: {exc}") from None
            self._from_fixture = (workerstart_loader, loader)
            if loader.spec != self._run.loader.spec:
                self._run.adopt(loader)
        return self._run.loader

    @pytest.fixture
    def ws_settings(self) -> Settings:
        return self._run.settings

    @pytest.fixture
    def ws_step_timeout(self):
        return self._run.waits.step_timeout

    @pytest.fixture
    def ws_boot_cost(self):
        return self._run.waits.measured_boot_cost

    @pytest.fixture
    def ws_lookahead(self):
        return self._run.lookahead
