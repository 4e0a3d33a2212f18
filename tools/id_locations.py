"""Where each check id lives: the table in docs/development.md, rendered from the code.

    python -m tools.id_locations            # print the table
    python -m tools.id_locations --write    # replace it in docs/development.md

For each id of the registry: the conformance function(s) that carry its marker, what
those functions (and the helpers of their own module they call) use from the package
and from the clause's judge modules in ``conformance/`` (scenarios, harness, probes,
judges; the foundations every check shares are left out), and the broken loaders that target it.
``tests/test_registry.py`` fails when the committed table differs from this rendering.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

from tools.rendered import DOCS, Part

PACKAGE = "pytest_workerstart."
#: shared by every check (ids, settings, measurements, datasets): not where an id's logic lives
FOUNDATIONS = ("registry", "settings", "verdict", "space", "protocol", "fixtures", "conformance", "checkenv", "bounded")


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the package module it comes from (``mod`` or ``mod:attr``)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and f"{node.module}.".startswith(PACKAGE):
            short = f"{node.module}.".removeprefix(PACKAGE)
            for alias in node.names:
                out[alias.asname or alias.name] = f"{short}{alias.name}"
    return out


def _module_of(qualified: str) -> str:
    """``probes.leaks.LeakSnapshot`` -> ``probes/leaks``: the file a name lives in."""
    from pytest_workerstart.registry import SUITE_DIR

    parts = qualified.split(".")
    root = Path(__file__).resolve().parent.parent / "pytest_workerstart"
    for k in range(len(parts), 0, -1):
        path = (SUITE_DIR.joinpath(*parts[1:k]) if parts[0] == "conformance" else root.joinpath(*parts[:k]))
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return "/".join(parts[:k])
    return "/".join(parts[:-1])


def _uses(module, func_name: str) -> set[str]:
    """Package modules outside the foundations that ``func_name`` (and its module's helpers it calls) uses."""
    tree = ast.parse(inspect.getsource(module))
    imported = _imports(tree)
    local = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    seen, todo, used = set(), [func_name], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in local:
            continue
        seen.add(name)
        for node in ast.walk(local[name]):
            if isinstance(node, ast.Name):
                if node.id in imported:
                    used.add(_module_of(imported[node.id]))
                elif node.id in local:
                    todo.append(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGE):
                target = node.value.removeprefix(PACKAGE).partition(":")  # a scenario named as "module:function"
                if target[1]:
                    used.add(target[0].replace(".", "/"))
    # a clause's helper module beside its checks (its judges) is where the id's logic lives
    return {u for u in used if u.split("/")[0] not in FOUNDATIONS or u.startswith("conformance/")}


def _room_files(check_id: str, funcs, uses: set[str]) -> list[str]:
    """The files that hold an id's logic: its room's modules its checks are in or reach (checks,
    judges, scenario code), the differential judge where it attributes differences to the id,
    and the space table where the id's space has corners of its own not declared beside the id."""
    from pytest_workerstart import parity, registry, space

    files = {m.__name__.removeprefix(f"{PACKAGE}conformance.").replace(".", "/") for m, _ in funcs}
    files |= {u.removeprefix("conformance/") for u in uses if u.startswith("conformance/")}
    found = [f"conformance/{f}.py" for f in sorted(files)]
    if check_id in parity.CLAUSES:
        found.append("pytest_workerstart/parity.py")
    own = space.get(check_id)
    declared = set(registry.get(check_id).corners)
    if own is not None and any(c not in space.DATA_CORNERS and c.id not in declared for c in own.corners):
        found.append("pytest_workerstart/space.py")
    return found


def _imported_by(files: list[str]) -> set[str]:
    """Package modules outside the foundations that the room's other files import."""
    from pytest_workerstart.registry import SUITE_DIR

    out = set()
    for f in files:
        if f.startswith("conformance/") and not Path(f).name.startswith("test_"):
            tree = ast.parse((SUITE_DIR / f.removeprefix("conformance/")).read_text())
            out |= {_module_of(q) for q in _imports(tree).values()}
    return {u for u in out if u.split("/")[0] not in FOUNDATIONS}


def rows() -> list[tuple[str, str, str, str]]:
    from pytest_workerstart import registry
    from pytest_workerstart.conformance import by_check_id
    from pytest_workerstart.fixtures.broken import catalog

    catches, speed_catches = catalog.load()
    by_id = {i: [(sys.modules[fn.__module__], name) for name, fn in fns] for i, fns in by_check_id().items()}
    out = []
    for check_id in registry.CHECKS:
        funcs = by_id.get(check_id, [])
        uses = {u for m, n in funcs for u in _uses(m, n)}
        logic = _room_files(check_id, funcs, uses)
        shared = sorted({u for u in uses | _imported_by(logic)
                         if not u.startswith("conformance/") and f"pytest_workerstart/{u}.py" not in logic})
        broken = sorted({f"`{c.loader}`" for c in (*catches.values(), *speed_catches.values())
                         if check_id in c.targets})
        out.append((f"`{check_id}`", f"{len(logic)}: " + ", ".join(f"`{f}`" for f in logic),
                    ", ".join(f"`{u}`" for u in shared) or "(none)", ", ".join(broken)))
    return out


def render() -> str:
    lines = ["| id | files holding its logic (checks, judges, scenario code, constants) | machinery it uses "
             "(pytest_workerstart/) | broken loaders (fixtures/broken/) |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r)} |" for r in rows()]
    return "\n".join(lines) + "\n"


PART = Part(DOCS / "development.md", "<!-- id-locations: begin -->", "<!-- id-locations: end -->",
            lambda: "\n" + render())


if __name__ == "__main__":
    sys.exit(PART.main(sys.argv[1:]))
