"""The conformance suite: one room (a folder) per contract clause.

A room holds everything a clause judges with: its checks (``test_<clause>.py`` and its other
``test_*.py``, what pytest collects; each check declared once, with its id, title and
requirements, read by :mod:`pytest_workerstart.registry`), its judges (functions of observed
data) and its scenario modules, the code its checks run in a fresh interpreter. **The rule of
a scenario module** (said at its top, kept by ``tests/test_registry.py``): it imports the
standard library, torch, psutil and the package's foundations, datasets, probes, harness and
:mod:`pytest_workerstart.scenarios` only, never a check module of any room nor the plugin's
session, since it runs where no pytest session is collecting.

``pytest --workerstart`` collects these modules from the installed package.
A project that ships a loader can instead run them from its own tests, with
no command-line flag (docs/adapter.md)::

    # tests/test_workerstart.py
    from pytest_workerstart.conformance import *  # noqa: F401,F403

    # tests/conftest.py
    @pytest.fixture(scope="session")
    def workerstart_loader():
        return MyLoader

The check functions are imported lazily, on that star import only, so
collecting the suite's own modules never imports them twice.
"""

from __future__ import annotations

import importlib
from typing import Any

from pytest_workerstart import registry

#: every module that holds a check, in the contract's order
_MODULES = tuple(".".join(p.relative_to(registry.SUITE_DIR).with_suffix("").parts) for p in registry.suite_modules())


def _checks() -> dict:
    found = {}
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        for attr, value in vars(module).items():
            if attr.startswith("test_") and callable(value):
                if attr in found:
                    raise ImportError(f"two checks named {attr}")
                found[attr] = value
    return found


def by_check_id() -> dict[str, list[tuple[str, Any]]]:
    """Check id -> (name, function) of each check function carrying its ``workerstart_check`` marker."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for name, fn in _checks().items():
        for mark in getattr(fn, "pytestmark", ()):
            if mark.name == registry.MARKER:
                out.setdefault(mark.args[0], []).append((name, fn))
    return out


def declaring(check_id: str) -> tuple[Any, Any]:
    """(function, module) of the check that declares ``check_id``."""
    for _, fn in by_check_id().get(check_id, ()):
        if any(m.name == registry.MARKER and m.args[0] == check_id and registry.declares(m.args, m.kwargs)
               for m in fn.pytestmark):
            return fn, importlib.import_module(fn.__module__)
    raise LookupError(f"no function declares {check_id}")


def __getattr__(name: str):
    if name == "__all__":
        return list(_checks())
    checks = _checks()
    if name in checks:
        return checks[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
