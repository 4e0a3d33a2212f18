"""Collection: each ``workerstart_check`` parametrized over the contexts its registry entry and
the profile select, marked with its limit, skips and expected failures, and told to the verdict."""

from __future__ import annotations

import platform
import warnings
from collections.abc import Callable

import pytest

from pytest_workerstart import explore, protocol, registry, space
from pytest_workerstart.session.waits import CHECK_TIMEOUT_S
from pytest_workerstart.settings import Settings, in_xdist_worker
from pytest_workerstart.verdict import Verdict, parse_nodeid

SUITE_DIR = registry.SUITE_DIR


def add_suite_path(config: pytest.Config) -> None:
    """Collect the suite's checks after the paths given on the command line, or alone."""
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args = [*config.args, str(SUITE_DIR)]
    else:
        config.args = [str(SUITE_DIR)]


def check_id_and_context(item: pytest.Item) -> tuple[str, str | None] | None:
    marker = item.get_closest_marker("workerstart_check")
    if marker is None:
        return None
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return marker.args[0], params.get("ws_context")


class CheckCollection:
    """The collection hooks of a ``--workerstart`` run (a plugin of its own)."""

    def __init__(self, settings: Settings, contexts: tuple[str, ...], verdict: Verdict,
                 parallel_contexts: Callable[[], tuple[str, ...]]):
        self.settings = settings
        self.contexts = contexts
        self.verdict = verdict
        self._parallel_contexts = parallel_contexts  # of the loader judged now
        self._matched_xfails: set[tuple[str, str | None]] = set()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        marker = metafunc.definition.get_closest_marker("workerstart_check")
        if marker is None or "ws_context" not in metafunc.fixturenames:
            return
        spec = registry.get(marker.args[0])
        check_id, only = spec.id, spec.contexts
        contexts = [c for c in self.contexts if only is None or c in only]
        if self.settings.profile == "quick":
            # forkserver (with preload) unless the clause says it is about spawn too; a
            # clause with a parallel path runs where the loader declares parallel start
            wanted = spec.quick_contexts
            declared = self._parallel_contexts()
            if spec.parallel_path and declared and not set(wanted) & set(declared):
                wanted = declared
            quick = [c for c in contexts if c in wanted]
            contexts = quick or contexts[:1]
        if not contexts:
            # An empty parameter set would become pytest's NOTSET: say why instead.
            reason = (f"{check_id} runs only in {', '.join(only)}, which is not among the selected contexts "
                      f"({', '.join(self.contexts)})")
            metafunc.parametrize("ws_context", [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
                                 ids=[f"{check_id}-none"])
            return
        metafunc.parametrize("ws_context", contexts, ids=[f"{check_id}-{c}" for c in contexts])
        if "ws_point" in metafunc.fixturenames:
            metafunc.parametrize("ws_point", explore.cases(check_id, self.settings))

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        available = set(protocol.available_contexts())
        for item in items:
            found = check_id_and_context(item)
            if found is None:
                continue
            spec = registry.get(found[0])
            check_id, ctx = spec.id, found[1]
            item.user_properties.append(("workerstart_check", check_id))
            item.user_properties.append(("workerstart_context", ctx))
            if item.get_closest_marker("timeout") is None:
                # pytest-timeout's signal method fails just this check on a hang.
                item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT_S))
            if ctx and ctx not in available:
                item.add_marker(pytest.mark.skip(reason=f"context {ctx!r} is not available on {platform.system()}"))
                continue
            # What the loader declares is judged when the check starts (check_env):
            # the loader may come from a conftest fixture, known only then.
            if spec.serial_only and in_xdist_worker():
                item.add_marker(pytest.mark.skip(reason="speed checks run serially, never under xdist"))
            case = item.callspec.id.removeprefix(f"{check_id}-") if hasattr(item, "callspec") else None
            # the most specific entry wins: id[context-case], then id[context], then id. An entry for
            # the whole check is strict for its own case, not for the corners and explored points of
            # its space (named id[context-corner]): which of those fail depends on the points judged
            for key in ((check_id, case), (check_id, ctx), (check_id, None)):
                if key[1] != "none" and key in self.settings.xfails:
                    self._matched_xfails.add(key)
                    strict = key[1] == case or case in (None, ctx) or space.get(check_id) is None
                    item.add_marker(pytest.mark.xfail(reason=self.settings.xfails[key], strict=strict))
                    break

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            found = check_id_and_context(item)
            if found is not None:
                self.verdict.deselect(item.nodeid, *found)

    def select(self, session: pytest.Session) -> None:
        """Tell the verdict which cases run; warn of expected-failure entries that match none."""
        for item in session.items:
            found = check_id_and_context(item)
            if found is not None:
                self.verdict.select(item.nodeid, *found)
        for key in self.settings.xfails.keys() - self._matched_xfails:
            check, ctx = key
            name = f"{check}[{ctx}]" if ctx else check
            warnings.warn(pytest.PytestConfigWarning(f"--workerstart-xfail entry {name!r} matches no collected check"),
                          stacklevel=1)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """Under xdist the controller never sees items: select from the node ids."""
        for nodeid in ids:
            parsed = parse_nodeid(nodeid)
            if parsed is not None:
                self.verdict.select(nodeid, *parsed)
