"""How a SPEC names a loader: a built-in name (``reference``, ``torch``, ``torchdata``) or
``module:attribute``, imported (an adapter module in the current directory too), and the
package whose version the verdict records."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

SPEC_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
BUILTIN_NAMES = ("reference", "torch", "torchdata")


class SpecError(Exception):
    """A loader SPEC, capability or option the user got wrong (a usage error)."""


def import_module(name: str) -> Any:
    """Import ``name``; an adapter module in the current directory is found too.

    ``python -m pytest`` puts the current directory on ``sys.path``, the
    ``pytest`` script does not: a SPEC naming ``./myadapter.py`` should not
    depend on which of the two the user typed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.split(".")[0]
        cwd = os.getcwd()
        here = os.path.isfile(os.path.join(cwd, f"{top}.py")) or os.path.isdir(os.path.join(cwd, top))
        if exc.name != top or not here or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)  # scenario processes inherit it (scenarios.child_env)
        return importlib.import_module(name)


def import_attr(spec: str) -> Any:
    if not SPEC_RE.match(spec):
        raise SpecError(
            f"malformed loader SPEC {spec!r}: expected a built-in name "
            f"({', '.join(BUILTIN_NAMES)}) or 'module:attribute'"
        )
    module_name, attr_path = spec.split(":", 1)
    try:
        obj: Any = import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise SpecError(f"loader SPEC {spec!r}: no module named {exc.name!r}") from None
        raise SpecError(f"loader SPEC {spec!r}: importing {module_name!r} failed: {exc!r}") from None
    except Exception as exc:  # the user's module raised while importing
        raise SpecError(f"loader SPEC {spec!r}: importing {module_name!r} failed: {exc!r}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError(f"loader SPEC {spec!r}: module {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise SpecError(f"loader SPEC {spec!r}: {attr_path!r} is a {type(obj).__name__}, not a callable")
    return obj


def package_of(factory: Any) -> str | None:
    """An adapter module is not what is tested: it names the package it adapts."""
    named = getattr(factory, "__workerstart_package__", None)
    if named is not None:
        if not isinstance(named, str) or not re.match(r"^[A-Za-z_]\w*$", named):
            raise SpecError(f"__workerstart_package__ = {named!r}: expected a top-level import name, e.g. 'litdata'")
        return named
    return (getattr(factory, "__module__", "") or "").split(".")[0] or None


def version_of(top: str | None) -> str:
    """The version of the distribution that provides import name ``top`` (else its ``__version__``)."""
    installed = _installed_version(top) if top else None
    if installed is not None:
        return installed
    try:
        mod = importlib.import_module(top) if top else None
    except ImportError as exc:
        raise SpecError(f"__workerstart_package__ names {top!r}, which does not import: {exc}") from None
    return str(getattr(mod, "__version__", "unknown"))


@functools.cache
def _installed_version(top: str) -> str | None:
    # The distribution named like the import name first: a lookup by name, where mapping every
    # installed distribution's files to its import names costs a quarter second of every run.
    try:
        dist = metadata.distribution(top)
        if top in ((dist.read_text("top_level.txt") or top).split()):
            return dist.version
    except Exception:  # metadata is best effort
        pass
    try:
        for name in metadata.packages_distributions().get(top, []):
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
    except Exception:
        pass
    return None


def accepts_kwarg(factory: Callable[..., Any], name: str) -> bool:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return True  # cannot tell (C callables): let the first check tell
    params = sig.parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in params) or name in sig.parameters


def builtin(name: str) -> tuple[Callable[..., Any], str | None, dict[str, Any]]:
    """Factory, parallelism kwarg and declared capabilities of a built-in name."""
    if name == "reference":
        # torch, only for the built-in loader named (resolving a user's SPEC imports nothing of ours)
        from pytest_workerstart import _torch_internals

        try:
            _torch_internals.check_supported()
        except _torch_internals.UnsupportedTorchError as exc:
            raise SpecError(f"built-in loader 'reference': {exc}") from None
        from pytest_workerstart.reference import ParallelStartDataLoader

        return (ParallelStartDataLoader, "worker_start_parallelism",
                dict(ParallelStartDataLoader.__workerstart_capabilities__))
    if name == "torch":
        from torch.utils.data import DataLoader

        # Stock torch starts workers one by one and its workers watch getppid(),
        # which is the forkserver (not the driver) under forkserver.
        return DataLoader, None, {"parallel_start": ()}
    if name == "torchdata":
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError as exc:
            raise SpecError(f"built-in loader 'torchdata' needs torchdata installed ({exc})") from None
        kwarg = "spawn_worker_start_parallelism"
        if accepts_kwarg(StatefulDataLoader, kwarg) and kwarg in inspect.signature(StatefulDataLoader).parameters:
            return StatefulDataLoader, kwarg, {"parallel_start": ("spawn",)}
        return StatefulDataLoader, None, {"parallel_start": ()}
    raise SpecError(f"unknown built-in loader {name!r}: choose one of {', '.join(BUILTIN_NAMES)} "
                    "or give 'module:attribute'")
