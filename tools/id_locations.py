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

DOC = Path(__file__).resolve().parent.parent / "docs" / "development.md"
BEGIN, END = "<!-- id-locations: begin -->", "<!-- id-locations: end -->"
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
    parts = qualified.split(".")
    root = Path(__file__).resolve().parent.parent / "pytest_workerstart"
    for k in range(len(parts), 0, -1):
        path = root.joinpath(*parts[:k])
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


def rows() -> list[tuple[str, str, str, str]]:
    from pytest_workerstart import registry
    from pytest_workerstart.conformance import by_check_id
    from pytest_workerstart.fixtures.broken import catalog

    catches, speed_catches = catalog.load()
    by_id = {i: [(sys.modules[fn.__module__], name) for name, fn in fns] for i, fns in by_check_id().items()}
    out = []
    for check_id in registry.CHECKS:
        funcs = by_id.get(check_id, [])
        where = ", ".join(sorted({f"`{m.__name__.rpartition('.')[2]}.py::{n}`" for m, n in funcs}))
        uses = sorted({u for m, n in funcs for u in _uses(m, n)})
        broken = sorted({f"`{c.loader}`" for c in (*catches.values(), *speed_catches.values())
                         if check_id in c.targets})
        out.append((f"`{check_id}`", where, ", ".join(f"`{u}`" for u in uses) or "(none)", ", ".join(broken)))
    return out


def render() -> str:
    lines = ["| id | check (conformance/) | uses (pytest_workerstart/) | broken loaders (fixtures/broken/) |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r)} |" for r in rows()]
    return "\n".join(lines) + "\n"


def replaced(text: str, table: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str]) -> int:
    table = render()
    if argv == ["--write"]:
        DOC.write_text(replaced(DOC.read_text(), table))
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
