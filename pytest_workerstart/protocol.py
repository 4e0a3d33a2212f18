"""The loader protocol: how a SPEC becomes something the suite can drive.

A loader under test is any callable ``make(dataset, **kwargs)`` taking torch
``DataLoader`` keyword arguments and returning an iterable of batches. Nothing
else is required; what it can do beyond that is *declared* as capabilities so
that checks needing a missing one are skipped with a reason, never dropped.

Capabilities come from, in increasing precedence:
1. the built-in adapter (``reference``, ``torch``, ``torchdata``);
2. an attribute ``__workerstart_capabilities__`` on the factory (a dict);
3. ``workerstart_capabilities`` in the ini file;
4. ``--workerstart-capability NAME=VALUE`` on the command line.
"""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import re
from collections.abc import Callable, Mapping
from typing import Any

from pytest_workerstart import point, space
from pytest_workerstart.loader_spec import (
    BUILTIN_NAMES,
    SpecError,
    accepts_kwarg,
    builtin,
    import_attr,
    package_of,
    version_of,
)
from pytest_workerstart.setting_values import KNOWN_CONTEXTS

#: Capability name -> (kind, default, description). ``contexts`` values are
#: comma-separated lists of context names; ``bool`` values are true/false.
CAPABILITIES: dict[str, tuple[str, Any, str]] = {
    "parallel_start": ("contexts", (), "contexts in which the loader starts workers concurrently"),
    "persistent_workers": ("bool", True, "honours persistent_workers=True (one pool per loader)"),
    "in_order": ("bool", True, "delivers batch k from worker k mod N"),
    "timeout": ("bool", True, "honours timeout= while waiting for a batch"),
    "worker_init_fn": ("bool", True, "calls worker_init_fn in each worker"),
    "iterable_dataset": ("bool", True, "supports IterableDataset"),
    "torch_parity": ("bool", True, "delivers torch DataLoader's batches and worker seeds for the same arguments"),
    "driver_watchdog": ("bool", True, "workers exit when the driving process dies"),
    "state_dict": ("bool", False, "state_dict()/load_state_dict() resume an epoch where it stopped "
                                  "(detected: the loader class has both methods)"),
    "differs_from_torch": ("dimensions", (), "dimensions of a point where the loader's documented semantics are "
                                             "its own (KEY or KEY=VALUE, e.g. shuffle or data=iterable): points "
                                             "that set them are not judged against torch's DataLoader"),
}

#: Declared in 0.1 but read by no check; declaring one is an error that says so.
REMOVED_CAPABILITIES = ("pin_memory", "custom_context")


@dataclasses.dataclass
class LoaderUnderTest:
    """A resolved loader: the factory plus everything the suite needs to know."""

    spec: str
    factory: Callable[..., Any]
    qualname: str
    version: str
    parallelism_kwarg: str | None
    capabilities: dict[str, Any]
    #: a user's loader for which no parallelism keyword was declared or found
    #: (the summary says so: parallel start was then never exercised)
    kwarg_not_found: bool = False
    #: the import name whose distribution ``version`` is: the factory's top-level
    #: package, or what an adapter names in ``__workerstart_package__``
    package: str | None = None

    def parallel_contexts(self) -> tuple[str, ...]:
        return tuple(self.capabilities.get("parallel_start", ()))

    def has(self, name: str, context: str | None = None) -> bool:
        value = self.capabilities.get(name)
        if CAPABILITIES[name][0] == "contexts":
            return context in value if context else bool(value)
        return bool(value)

    def make(self, dataset, *, parallelism: int | None = None, **kwargs):
        """Build the loader; ``parallelism`` goes through the declared kwarg."""
        if parallelism is not None:
            if self.parallelism_kwarg is None:
                raise SpecError(f"loader {self.spec!r} has no parallelism keyword")
            kwargs[self.parallelism_kwarg] = parallelism
        space.note_build(dataset, kwargs.get(self.parallelism_kwarg) if self.parallelism_kwarg else None, kwargs)
        return self.factory(dataset, **kwargs)

    @property
    def label(self) -> str:
        """``qualname version``; an adapter also names the package the version is of."""
        own = self.qualname.split(".")[0] == self.package
        return f"{self.qualname} {self.version}" if own else f"{self.qualname}, {self.package} {self.version}"

    @property
    def subclasses_torch(self) -> bool:
        """A class derived from (not equal to) torch's DataLoader: it inherits torch's behaviour."""
        from torch.utils.data import DataLoader

        return (isinstance(self.factory, type) and issubclass(self.factory, DataLoader)
                and self.factory is not DataLoader)

    def describe(self) -> dict[str, Any]:
        """The loader as the verdict records it: what was tested, with which keyword and declarations."""
        return {"spec": self.spec, "qualified_name": self.qualname, "version": self.version,
                "package": self.package,
                "parallelism_kwarg": self.parallelism_kwarg,
                "capabilities": self._capabilities_json()}

    def _capabilities_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.capabilities.items()}

    def payload(self) -> dict[str, Any]:
        """What a fresh interpreter needs to rebuild this loader (JSON); see :func:`from_payload`."""
        return {"spec": self.spec, "kwarg": self.parallelism_kwarg or "none", "caps": self._capabilities_json(),
                "version": self.version}


def from_payload(payload: Mapping[str, Any]) -> LoaderUnderTest:
    """The loader a :meth:`LoaderUnderTest.payload` describes, rebuilt in this interpreter."""
    return resolve(payload["spec"], payload.get("kwarg"), payload.get("caps"), version=payload.get("version"))


def parse_capability(item: str) -> tuple[str, Any]:
    """``NAME=VALUE`` -> (name, parsed value); unknown names are usage errors."""
    if "=" not in item:
        raise SpecError(f"capability {item!r}: expected NAME=VALUE")
    name, raw = (s.strip() for s in item.split("=", 1))
    _check_capability_name(name, f"capability {item!r}")
    return name, _coerce(name, raw)


def _check_capability_name(name: str, where: str) -> None:
    if name in REMOVED_CAPABILITIES:
        raise SpecError(f"{where}: capability {name!r} was removed in 0.2 (no check read it); drop the declaration")
    if name not in CAPABILITIES:
        raise SpecError(f"unknown capability {name!r}: known are {', '.join(sorted(CAPABILITIES))}")


def _coerce(name: str, value: Any) -> Any:
    kind = CAPABILITIES[name][0]
    if kind == "dimensions":
        items = [v.strip() for v in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value]
        try:
            return tuple(point.declared(item) for item in items if item and item != "none")
        except point.PointError as exc:
            raise SpecError(f"capability {name}: {exc}") from None
    if kind == "contexts":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
        value = tuple(value)
        for ctx in value:
            if ctx not in KNOWN_CONTEXTS:
                raise SpecError(f"capability {name}: unknown context {ctx!r}")
        return value
    if isinstance(value, str):
        low = value.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise SpecError(f"capability {name}: expected true/false, got {value!r}")
    return bool(value)


def resolve(
    spec: str,
    parallelism_kwarg: str | None = None,
    capability_overrides: Mapping[str, Any] | None = None,
    *,
    version: str | None = None,
) -> LoaderUnderTest:
    """Turn a SPEC into a :class:`LoaderUnderTest`, or raise :class:`SpecError`.

    ``parallelism_kwarg``: ``None`` means "the default for this loader",
    ``"none"`` means "no parallel start". ``version``: what the driving process found (a
    scenario's interpreter need not look again).
    """
    spec = spec.strip()
    known = spec in BUILTIN_NAMES  # built-ins say themselves whether they have a keyword
    caps: dict[str, Any] = {name: default for name, (_, default, _) in CAPABILITIES.items()}
    if ":" in spec:
        factory = import_attr(spec)
        default_kwarg = getattr(factory, "__workerstart_parallelism_kwarg__", None)
        if default_kwarg is None:
            for candidate in ("worker_start_parallelism", "spawn_worker_start_parallelism"):
                try:
                    if candidate in inspect.signature(factory).parameters:
                        default_kwarg = candidate
                        break
                except (TypeError, ValueError):
                    break
        declared = getattr(factory, "__workerstart_capabilities__", None)
        if declared is None and default_kwarg:
            # A torch-signature class with a parallelism kwarg but no declaration:
            # assume the common case (spawn) and let the user widen it.
            declared = {"parallel_start": ("spawn",) if default_kwarg.startswith("spawn") else ("spawn", "forkserver")}
        # Well-known third-party classes given by module:attr get the built-in's declaration.
        for name in ("torch", "torchdata"):
            try:
                b_factory, b_kwarg, b_caps = builtin(name)
            except SpecError:
                continue
            if b_factory is factory:
                known = True
                declared = {**b_caps, **(declared or {})}
                default_kwarg = default_kwarg or b_kwarg
        for key, value in (declared or {}).items():
            _check_capability_name(key, f"{spec}: __workerstart_capabilities__")
            caps[key] = _coerce(key, value)
    elif spec in BUILTIN_NAMES:
        factory, default_kwarg, declared = builtin(spec)
        for key, value in declared.items():
            caps[key] = _coerce(key, value)
    elif not spec or not re.match(r"^[A-Za-z_]\w*$", spec):
        raise SpecError(f"malformed loader SPEC {spec!r}: expected a built-in name ({', '.join(BUILTIN_NAMES)}) "
                        "or 'module:attribute'")
    else:
        builtin(spec)  # raises the "unknown built-in" error
        raise AssertionError("unreachable")

    if "state_dict" not in (declared or {}):
        caps["state_dict"] = all(callable(getattr(factory, m, None)) for m in ("state_dict", "load_state_dict"))
    package = package_of(factory)
    if parallelism_kwarg is None:
        kwarg = default_kwarg
    elif parallelism_kwarg.lower() == "none":
        kwarg = None
    else:
        kwarg = parallelism_kwarg
    if kwarg is not None and not accepts_kwarg(factory, kwarg):
        raise SpecError(f"loader {spec!r} does not accept the parallelism keyword {kwarg!r}")
    if kwarg is None:
        caps["parallel_start"] = ()
    elif parallelism_kwarg not in (None, "none") and not caps["parallel_start"]:
        caps["parallel_start"] = ("spawn", "forkserver")
    for key, value in (capability_overrides or {}).items():
        caps[key] = _coerce(key, value)
    return LoaderUnderTest(
        spec=spec,
        factory=factory,
        qualname=f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}",
        version=version if version is not None else version_of(package),
        package=package,
        parallelism_kwarg=kwarg,
        capabilities=caps,
        # declaring parallel_start (even as none) is an answer: nothing to hint
        kwarg_not_found=kwarg is None and parallelism_kwarg is None and not known
        and getattr(factory, "__workerstart_parallelism_kwarg__", None) is None
        and "parallel_start" not in (declared or {}),
    )


def forwarded_keyword(error_text: str, kwarg: str | None) -> bool:
    """Whether an error says ``kwarg`` was not taken: the loader forwarded it to a
    callee (torch's ``DataLoader.__init__``) that does not know it."""
    return bool(kwarg) and re.search(rf"unexpected keyword argument '{re.escape(kwarg)}'", error_text) is not None


def requirement_gap(loader: LoaderUnderTest, check, context: str | None) -> str | None:
    """Why ``loader`` cannot run ``check`` (a registry entry) in ``context``, or None."""
    if check.needs_parallelism_kwarg and loader.parallelism_kwarg is None:
        return "loader does not declare capability 'parallel_start' (no parallelism keyword)"
    for cap in check.requires:
        per_context = CAPABILITIES[cap][0] == "contexts"
        if not loader.has(cap, context if per_context else None):
            where = f" for context {context!r}" if per_context else ""
            return f"loader does not declare capability {cap!r}{where}"
    return None


def from_factory(obj: Any) -> LoaderUnderTest:
    """What a project's ``workerstart_loader`` fixture returns, as a LoaderUnderTest.

    Accepted (as anyio's ``anyio_backend`` accepts a name or a (name, options)
    pair): a SPEC string, a factory, or ``(factory or SPEC, {"parallelism_kwarg":
    ..., "capabilities": {...}})``. A factory must be importable as
    ``module:attribute``: scenario checks rebuild it in fresh interpreters.
    """
    if isinstance(obj, LoaderUnderTest):
        return obj
    options: Mapping[str, Any] = {}
    if isinstance(obj, tuple):
        if len(obj) != 2 or not isinstance(obj[1], Mapping):
            raise SpecError(f"expected a factory, a SPEC or (factory, options dict), got {obj!r}")
        obj, options = obj
        unknown = set(options) - {"parallelism_kwarg", "capabilities"}
        if unknown:
            raise SpecError(f"unknown options {sorted(unknown)}: use parallelism_kwarg and capabilities")
    if isinstance(obj, str):
        spec = obj
    elif callable(obj):
        spec = f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"
        try:
            same = import_attr(spec) is obj
        except SpecError:
            same = False
        if not same:
            raise SpecError(f"{obj!r} is not importable as {spec!r}: define the factory at module level of an "
                            "importable module (scenario checks rebuild it in a fresh interpreter)")
    else:
        raise SpecError(f"expected a factory, a SPEC or (factory, options dict), got {type(obj).__name__}")
    caps = {k: _coerce(k, v) for k, v in dict(options.get("capabilities", {})).items()
            if not _check_capability_name(k, "workerstart_loader fixture")}
    return resolve(spec, options.get("parallelism_kwarg"), caps)


def available_contexts() -> tuple[str, ...]:
    """Contexts this platform offers, in the suite's canonical order."""
    have = set(multiprocessing.get_all_start_methods())
    return tuple(c for c in KNOWN_CONTEXTS if c in have)
