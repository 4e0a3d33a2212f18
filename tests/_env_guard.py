"""A self-test must leave the process as it found it (CPython regrtest's ``--fail-env-changed``).

Several self-tests share one xdist worker: state one of them leaves behind (a signal
handler, torch's table of worker pids, a start method, an environment variable) changes
what the next one meets, and its failure then shows up in a test that did nothing wrong.
This plugin snapshots process-global state before each test and compares after it; the
test that changed something fails at teardown, naming what, and the state is put back so
later tests start clean.

Tests that run torch's DataLoader (or the suite) in this process use the
``torch_process_state`` fixture, which puts torch's SIGCHLD handler and worker-pid table
back when the test ends (``pytest_workerstart._torch_internals.process_state_restored``).

Not snapshotted: atexit callbacks (torch and multiprocessing register theirs once per
process, on first use, and they cannot be unregistered without the function) and
``sys.modules`` additions (imports are cached by design); a module replaced or removed is.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

#: signals whose disposition the kernel lets a process change; not SIGALRM, pytest-timeout's,
#: which it arms and disarms around each test itself
SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM})


def _handlers() -> dict[int, Any]:
    return {s: signal.getsignal(s) for s in SIGNALS}


def _restore_handlers(saved: dict[int, Any]) -> None:
    for s, handler in saved.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)


def _torch_sigchld_note() -> bool | None:
    if "torch.utils.data" not in sys.modules:  # importing the internals would import torch
        return None
    from pytest_workerstart import _torch_internals

    return _torch_internals.sigchld_note()


def _restore_torch_sigchld_note(value: bool | None) -> None:
    if value is not None:
        from pytest_workerstart import _torch_internals

        _torch_internals.set_sigchld_note(value)


def _start_method() -> str | None:
    return multiprocessing.get_start_method(allow_none=True)


#: the platform's default, which any use of the default context fixes (documented as the first)
DEFAULT_START_METHOD = multiprocessing.get_all_start_methods()[0]


def _restore_start_method(method: str | None) -> None:
    multiprocessing.set_start_method(method, force=True)


#: set by pytest itself for each phase of each test
OWN_VARIABLES = ("PYTEST_CURRENT_TEST",)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}


def _restore_environ(saved: dict[str, str]) -> None:
    own = {k: os.environ[k] for k in OWN_VARIABLES if k in os.environ}
    os.environ.clear()
    os.environ.update(saved, **own)


def _modules() -> dict[str, int]:
    # a None entry is the import system's "not importable (yet)": filling it is an import
    return {name: id(module) for name, module in list(sys.modules.items()) if module is not None}


def _resource_tracker() -> int | None:
    from multiprocessing import resource_tracker

    return resource_tracker._resource_tracker._pid


@dataclass(frozen=True)
class Item:
    name: str
    take: Callable[[], Any]
    restore: Callable[[Any], None] | None = None  # None: reported, not put back
    #: how a change is judged: by default ``before != after``
    changed: Callable[[Any, Any], bool] = lambda before, after: before != after


ITEMS = (
    Item("signal handlers", _handlers, _restore_handlers),
    Item("torch's note that its SIGCHLD handler is installed", _torch_sigchld_note, _restore_torch_sigchld_note,
         lambda before, after: before is not None and before != after),
    # unset -> the default is what any use of the default context does; another method is a change
    Item("multiprocessing start method", _start_method, _restore_start_method,
         lambda before, after: (before or DEFAULT_START_METHOD) != (after or DEFAULT_START_METHOD)),
    Item("os.environ", _environ, _restore_environ),
    Item("sys.path", lambda: list(sys.path), lambda saved: sys.path.__setitem__(slice(None), saved)),
    Item("working directory", os.getcwd, os.chdir),
    # added modules are imports; one replaced or removed changes what later tests import
    Item("sys.modules (replaced or removed)", _modules, None,
         lambda before, after: any(after.get(name) != ident for name, ident in before.items())),
    # started is fine (lazily, by the first semaphore); replaced or gone is another process's doing
    Item("multiprocessing resource tracker", _resource_tracker, None,
         lambda before, after: before is not None and before != after),
)


def _describe(item: Item, before: Any, after: Any) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        # replaced or removed first: for sys.modules only those count, and additions are many
        keys = sorted({k for k in before.keys() | after.keys() if before.get(k) != after.get(k)},
                      key=lambda k: (k not in before, str(k)))
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:4])
        return f"{item.name} ({shown}{', ...' if len(keys) > 4 else ''})"
    return f"{item.name} ({before!r} -> {after!r})"


def snapshot() -> dict[str, Any]:
    return {item.name: item.take() for item in ITEMS}


def changes(before: dict[str, Any]) -> list[str]:
    """What differs from ``before``; each changed item that can be put back is put back."""
    found = []
    for item in ITEMS:
        now = item.take()
        if item.changed(before[item.name], now):
            found.append(_describe(item, before[item.name], now))
            if item.restore is not None:
                item.restore(before[item.name])
    return found


def is_a_check(request: pytest.FixtureRequest) -> bool:
    """A check of a ``pytest --workerstart`` run started from the checkout, which loads this plugin
    too (tests/ is where the testpaths' conftest lives): it judges a loader, it is not a self-test."""
    return request.node.get_closest_marker("workerstart_check") is not None


@pytest.fixture(autouse=True)
def _process_state_unchanged(request):
    if is_a_check(request):
        yield
        return
    before = snapshot()
    yield
    found = changes(before)
    if found:
        pytest.fail("the test changed process-global state (put back now): " + "; ".join(found), pytrace=False)


@pytest.fixture
def torch_process_state():
    """For a test that runs torch's DataLoader (or the suite) in this process: torch's SIGCHLD
    handler and worker-pid table are as they were when it ends."""
    from pytest_workerstart._torch_internals import process_state_restored

    with process_state_restored() as live:
        yield live


@pytest.fixture
def environ_restored():
    """For a test that imports a library which sets environment variables as it is imported
    (monai sets ``CUBLAS_WORKSPACE_CONFIG``): the environment as it was when the test ends."""
    saved = _environ()
    yield
    _restore_environ(saved)
