"""docs/contract.md's clause sections, rendered from the rooms.

    python -m tools.contract_page            # print the sections
    python -m tools.contract_page --write    # replace them in docs/contract.md

Under each heading of :data:`pytest_workerstart.registry.CLAUSES`: the text of the rooms that
share it (each room's docstring after its first line), then one row per check id, in the
registry's order: what it proves and what observes it, from the docstring of the function that
declares the id (its paragraphs up to one that starts ``Observed by:``, and that one), and the
broken loaders that declare they catch it. ``${NAME}`` in such a docstring is the value of the
constant ``NAME`` of the check's module, so the page states what the code uses.
``tests/test_registry.py`` fails when the committed page differs from this rendering.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from tools.rendered import DOCS, Part

OBSERVED = "Observed by:"
_CONSTANT = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _filled(text: str, module) -> str:
    def value(m: re.Match) -> str:
        if not hasattr(module, m[1]):
            raise LookupError(f"{module.__name__} has no constant {m[1]} (named in a docstring)")
        return _shown(getattr(module, m[1]))

    return _CONSTANT.sub(value, text)


def _one_line(paragraphs: list[str]) -> str:
    return " ".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs).strip()


def cells(fn, module) -> tuple[str, str]:
    """(proves, observed by) of a declaring check function."""
    paragraphs = (inspect.getdoc(fn) or "").split("\n\n")
    marks = [i for i, p in enumerate(paragraphs) if p.startswith(OBSERVED)]
    if not marks:
        raise LookupError(f"{module.__name__}.{fn.__name__}: its docstring has no '{OBSERVED}' paragraph")
    proves = _one_line(paragraphs[:marks[0]])
    observed = _one_line([paragraphs[marks[0]].removeprefix(OBSERVED)])
    return _filled(proves, module), _filled(observed, module)


def _catchers(check_id: str) -> str:
    from pytest_workerstart.fixtures.broken import catalog

    catches, speed_catches = catalog.load()
    found = []
    for c in sorted((*catches.values(), *speed_catches.values()), key=lambda c: c.loader):
        if check_id in c.targets:
            notes = (" (on torch)" if c.module.endswith(".on_torch") else "") + (
                " (strict)" if "--workerstart-strict" in c.options else "")
            found.append(f"`{c.loader}`{notes}")
    return ", ".join(found)


def render() -> str:
    from pytest_workerstart import registry
    from pytest_workerstart.conformance import declaring

    out: list[str] = []
    for heading in dict.fromkeys(registry.CLAUSES.values()):
        clauses = [c for c, h in registry.CLAUSES.items() if h == heading]
        out.append(f"## {heading}\n")
        for clause in clauses:
            room = importlib.import_module(f"pytest_workerstart.conformance.{clause}")
            text = (inspect.getdoc(room) or "").partition("\n\n")[2].strip()
            if text:
                out.append(_filled(text, room) + "\n")
        out += ["| id | proves | observed by | caught broken loader |", "|---|---|---|---|"]
        for check in registry.CHECKS.values():
            if check.clause in clauses:
                proves, observed = cells(*declaring(check.id))
                out.append(f"| `{check.id}` | {proves} | {observed} | {_catchers(check.id)} |")
        out.append("")
    return "\n".join(out)


PART = Part(DOCS / "contract.md", "<!-- clauses: rendered from conformance/ by python -m tools.contract_page -->",
            "<!-- end of the rendered clauses -->", lambda: "\n\n" + render())


if __name__ == "__main__":
    sys.exit(PART.main(sys.argv[1:]))
