"""The registry is the one list of check ids, read from the checks' declarations: the markers
pytest sees, the docs and the broken loaders agree with it."""

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import registry
from pytest_workerstart.fixtures.broken import catalog

CATCHES, SPEED_CATCHES = catalog.load()

ROOT = Path(__file__).resolve().parent.parent


def _markers() -> dict[str, list[tuple[str, Any]]]:
    """check id -> (module, marker) of every function pytest would see carrying its marker."""
    import pytest_workerstart.conformance as suite

    out: dict[str, list[tuple[str, Any]]] = {}
    for module in suite._MODULES:
        for name, fn in vars(importlib.import_module(f"{suite.__name__}.{module}")).items():
            for mark in getattr(fn, "pytestmark", ()) if name.startswith("test_") else ():
                if mark.name == registry.MARKER:
                    out.setdefault(mark.args[0], []).append((module, mark))
    return out


def test_the_registry_is_what_the_markers_declare():
    """Read from the source, the table equals the markers pytest sees: each id declared once (id,
    title, requirements), its other functions naming the id only, all in the declaring module."""
    marked = _markers()
    assert set(marked) == set(registry.CHECKS), (
        f"marked but not declared: {sorted(set(marked) - set(registry.CHECKS))}; "
        f"declared but never marked: {sorted(set(registry.CHECKS) - set(marked))}")
    for check_id, marks in marked.items():
        declared = registry.CHECKS[check_id]
        declarations = [m for _, m in marks if registry.declares(m.args, m.kwargs)]
        assert len(declarations) == 1, (check_id, declarations)
        at_runtime = registry.Check(*declarations[0].args, module=declared.module, **declarations[0].kwargs)
        assert at_runtime == declared, (check_id, at_runtime, declared)
        assert {module for module, _ in marks} == {declared.module}, (check_id, marks)


def test_a_declaration_that_is_not_literal_is_refused(tmp_path, monkeypatch):
    room = tmp_path / "start"
    room.mkdir()
    (room / "test_start.py").write_text('REQ = ("x",)\n\n\n@check("start.a", "a title", requires=REQ)\n'
                                        'def test_a(check_env):\n    pass\n')
    monkeypatch.setattr(registry, "SUITE_DIR", tmp_path)
    registry._read.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"test_start.py:4: a check's declaration holds literals only"):
            registry.get("start.a")
        (room / "test_start.py").write_text('@check("start.a", "a title",\n       requires=("timeout",))\n'
                                            'def test_a(check_env):\n    pass\n')
        registry._read.cache_clear()
        assert registry.get("start.a") == registry.Check("start.a", "a title", ("timeout",), module="start.test_start")
        with pytest.raises(KeyError, match="no conformance function declares it"):
            registry.get("start.b")
    finally:
        monkeypatch.undo()
        registry._read.cache_clear()


def test_contract_tables_match_the_registry():
    """Each id is a row of the table under its clause's heading, naming the loaders that catch it."""
    text = (ROOT / "docs" / "contract.md").read_text()
    sections = dict(re.findall(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    catchers: dict[str, set[str]] = {}
    for c in (*CATCHES.values(), *SPEED_CATCHES.values()):
        for t in c.targets:
            catchers.setdefault(t, set()).add(c.loader)
    documented = set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", text, re.M))
    assert documented == set(registry.CHECKS), sorted(documented ^ set(registry.CHECKS))
    for check_id, check in registry.CHECKS.items():
        heading = registry.CLAUSES[check.clause]
        row = re.search(rf"^\| `{re.escape(check_id)}` \|.*$", sections[heading], re.M)
        assert row, f"{check_id} is not in the '{heading}' table of docs/contract.md"
        named = set(re.findall(r"`([A-Z]\w+)`", row.group(0).split("|")[-2]))
        assert named == catchers[check_id], (check_id, named, catchers[check_id])


def test_requirements_name_known_capabilities():
    from pytest_workerstart.protocol import CAPABILITIES

    for check in registry.CHECKS.values():
        assert set(check.requires) <= set(CAPABILITIES), check


def test_help_lists_the_check_ids(pytester):
    out = pytester.runpytest_subprocess("--help").stdout.str()
    for check_id in registry.CHECKS:
        assert check_id in out, check_id


def test_every_capability_is_read_by_a_check():
    """A declared capability that no check reads would promise a skip that never happens."""
    from pytest_workerstart.protocol import CAPABILITIES

    required = {cap for check in registry.CHECKS.values() for cap in check.requires}
    inline = set()
    judges = [*(ROOT / "conformance").rglob("test_*.py"), ROOT / "pytest_workerstart" / "explore.py"]
    for path in judges:
        inline |= set(re.findall(r"""(?:\.has\(|capabilities\.get\()["']([a-z_]+)["']""", path.read_text()))
    assert set(CAPABILITIES) <= required | inline, sorted(set(CAPABILITIES) - required - inline)


def test_conformance_package_lists_every_module():
    import pytest_workerstart.conformance as suite

    modules = {".".join(p.relative_to(ROOT / "conformance").with_suffix("").parts)
               for p in (ROOT / "conformance").rglob("test_*.py")}
    assert set(suite._MODULES) == modules
    assert {c.module for c in registry.CHECKS.values()} == modules


def test_the_id_location_table_is_current():
    """docs/development.md's table of where each id lives is the one rendered from the code."""
    from tools import id_locations

    assert id_locations.PART.current(), (
        "docs/development.md is stale: run `python -m tools.id_locations --write`")


#: what a room's non-check module (judges, scenario code) may never import: the session that
#: collects (scenario code runs where none does) and the check modules
_FORBIDDEN = ("pytest_workerstart.session", "pytest_workerstart.plugin", "pytest_workerstart.checkenv",
              "pytest_workerstart.api")


def test_room_modules_keep_the_rooms_import_rule():
    rooms = ROOT / "conformance"
    for path in rooms.glob("*/*.py"):
        if path.name.startswith("test_") or path.name == "__init__.py":
            continue
        text = path.read_text()
        doc = text.split('"""')[1]
        if "fresh interpreter" in doc:
            assert "the rooms' rule" in doc, f"{path}: a scenario module says its import rule at its top"
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(_FORBIDDEN), f"{path.relative_to(ROOT)} imports {name}"
                assert ".test_" not in f".{name}", f"{path.relative_to(ROOT)} imports a check module: {name}"


def test_the_contract_page_is_rendered_from_the_rooms():
    """docs/contract.md's clause sections are the rooms' texts and each declaring function's docstring."""
    from tools import contract_page

    assert contract_page.PART.current(), (
        "docs/contract.md is stale: run `python -m tools.contract_page --write`")


def test_a_docstring_names_a_constant_its_module_has():
    import types

    from tools import contract_page

    module = types.SimpleNamespace(__name__="room.test_x", N=3, BOUND_S=2.0)

    def check():
        """N = ${N} workers within ${BOUND_S} s

        Observed by: a probe
        """

    assert contract_page.cells(check, module) == ("N = 3 workers within 2 s", "a probe")
    check.__doc__ = "uses ${MISSING}\n\nObserved by: x"
    with pytest.raises(LookupError, match="room.test_x has no constant MISSING"):
        contract_page.cells(check, module)
    check.__doc__ = "no observation paragraph"
    with pytest.raises(LookupError, match="has no 'Observed by:' paragraph"):
        contract_page.cells(check, module)
