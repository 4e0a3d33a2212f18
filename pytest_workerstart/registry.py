"""The contract's checks, one entry each, read from the checks' own declarations.

A conformance function declares its id where it is defined:
``@pytest.mark.workerstart_check(ID, TITLE, **requirements)`` on one function per id (its
other functions name the id only). This module reads those declarations from the suite's
source without importing it (the plugin needs the ids at startup, before anything imports
torch), so the table is never kept beside the checks. ``tests/test_registry.py`` keeps the
read table equal to the markers pytest sees, and ``docs/contract.md`` and the broken loaders
(which declare what they catch with :func:`pytest_workerstart.fixtures.broken.catches`) in
step with it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from pathlib import Path

#: Where the suite's modules are: in the installed package, or beside it in a source checkout.
SUITE_DIR = Path(__file__).resolve().parent / "conformance"
if not SUITE_DIR.is_dir():  # an editable install maps the package's conformance/ to the top-level one
    SUITE_DIR = Path(__file__).resolve().parent.parent / "conformance"

#: Clause name -> its heading in docs/contract.md, in the contract's order.
CLAUSES = {
    "start": "Start",
    "order": "Order",
    "digest": "Digest",
    "failure": "Failure",
    "leaks": "Leaks and seed properties",
    "persistent": "Leaks and seed properties",
    "prefetch": "Leaks and seed properties",
    "sharding": "Leaks and seed properties",
    "transfer": "Leaks and seed properties",
    "exit": "Exit",
    "memory": "Memory",
    "resume": "Resume",
    "speed": "Speed",
}
#: The marker that declares a check, and the local name the suite's modules give it.
MARKER, ALIAS = "workerstart_check", "check"


def declares(args, kwargs) -> bool:
    """Whether a marker's arguments declare its id (a title, requirements), not only name it."""
    return len(args) > 1 or bool(kwargs)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check id and what running it requires."""

    id: str
    title: str
    #: capabilities the loader must declare (else: skipped with the capability named)
    requires: tuple[str, ...] = ()
    #: the only contexts it runs in (None: every selected context)
    contexts: tuple[str, ...] | None = None
    #: contexts it runs in under the quick profile
    quick_contexts: tuple[str, ...] = ("forkserver",)
    #: skipped when the loader has no parallelism keyword
    needs_parallelism_kwarg: bool = False
    #: never under xdist (it needs the machine to itself)
    serial_only: bool = False
    #: the conformance module that declares it, dotted from the suite's directory
    module: str = ""
    #: exercises parallel start (p > 1) where the loader declares it; the quick
    #: profile then runs it in such a context, and the coverage record says so
    parallel_path: bool = True
    #: corners of its own, beside those its space shares: ``{ID: {"at": POINT_TEXT, "why": ...,
    #: "profiles": (...), "collected": bool}}`` (built into its Space by :mod:`pytest_workerstart.space`)
    corners: dict[str, dict] = dataclasses.field(default_factory=dict, hash=False)

    @property
    def clause(self) -> str:
        return self.id.split(".", 1)[0]


def suite_modules() -> list[Path]:
    """The suite's check modules, by clause in the contract's order: a room's ``test_<clause>.py``
    first, then its other modules; a module no clause names last."""
    order = list(CLAUSES)

    def key(path: Path) -> tuple:
        rel = path.relative_to(SUITE_DIR)
        clause = rel.parts[0] if len(rel.parts) > 1 else rel.stem.removeprefix("test_")
        return (order.index(clause) if clause in order else len(order), path.stem != f"test_{clause}", str(rel))

    return sorted(SUITE_DIR.rglob("test_*.py"), key=key)


def _declared(call: ast.Call, module: str, where: str) -> Check:
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except ValueError:
        raise ValueError(f"{where}: a check's declaration holds literals only") from None
    if len(call.keywords) != len(kwargs):
        raise ValueError(f"{where}: a check's declaration names each requirement (no **)")
    return Check(*args, module=module, **kwargs)


#: a line that opens a check's marker (a decorator, or ``pytestmark = ...``)
_OPENS = re.compile(rf"^[ \t]*(?:@|pytestmark[ \t]*=[ \t]*)((?:{ALIAS}|pytest\.mark\.{MARKER})\()", re.M)


def _markers(text: str):
    """Each marker call in ``text``, parsed alone (the whole module's parse costs every pytest
    startup ~50 ms; the markers' ~1 ms)."""
    for m in _OPENS.finditer(text):
        lines = text[m.start(1):].split("\n", 40)
        for k in range(1, len(lines) + 1):
            try:
                yield ast.parse("\n".join(lines[:k]), mode="eval").body, text.count("\n", 0, m.start()) + 1
                break
            except SyntaxError:
                continue


@functools.cache
def _read() -> dict[str, Check]:
    found: dict[str, Check] = {}
    for path in suite_modules():
        module = ".".join(path.relative_to(SUITE_DIR).with_suffix("").parts)
        for call, line in _markers(path.read_text()):
            if isinstance(call, ast.Call) and declares(call.args, call.keywords):
                where = f"{path.name}:{line}"
                check = _declared(call, module, where)
                if check.id in found:
                    raise ValueError(f"{where}: {check.id} is declared twice")
                found[check.id] = check
    return found


def __getattr__(name: str):
    if name == "CHECKS":  # read on first use: importing the registry reads no file
        return _read()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(check_id: str) -> Check:
    try:
        return _read()[check_id]
    except KeyError:
        raise KeyError(f"unknown check id {check_id!r}: no conformance function declares it "
                       f"(@pytest.mark.{MARKER}(ID, TITLE, ...))") from None
