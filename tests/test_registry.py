"""The registry is the one list of check ids: markers, docs and broken loaders agree with it."""

import ast
import re
from pathlib import Path

from pytest_workerstart import registry
from pytest_workerstart.fixtures.broken import catalog

CATCHES, SPEED_CATCHES = catalog.load()

ROOT = Path(__file__).resolve().parent.parent


def _marked_ids() -> dict[str, set[str]]:
    """check id -> conformance modules whose functions carry its marker."""
    out: dict[str, set[str]] = {}
    for path in (ROOT / "conformance").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "check":
                        assert len(dec.args) == 1 and not dec.keywords, (
                            f"{path.name}:{node.name}: a marker names its id only; requirements live in the registry")
                        out.setdefault(dec.args[0].value, set()).add(path.stem)
    return out


def test_markers_match_the_registry():
    marked = _marked_ids()
    assert set(marked) == set(registry.CHECKS), (
        f"marked but not registered: {sorted(set(marked) - set(registry.CHECKS))}; "
        f"registered but never marked: {sorted(set(registry.CHECKS) - set(marked))}")
    for check_id, modules in marked.items():
        assert modules == {registry.CHECKS[check_id].conformance_module}, (check_id, modules)


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
        heading = registry.CLAUSES[check.clause][1]
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
    judges = [*(ROOT / "conformance").glob("test_*.py"), ROOT / "pytest_workerstart" / "explore.py"]
    for path in judges:
        inline |= set(re.findall(r"""(?:\.has\(|capabilities\.get\()["']([a-z_]+)["']""", path.read_text()))
    assert set(CAPABILITIES) <= required | inline, sorted(set(CAPABILITIES) - required - inline)


def test_conformance_package_lists_every_module():
    import pytest_workerstart.conformance as suite

    modules = {p.stem for p in (ROOT / "conformance").glob("test_*.py")}
    assert set(suite._MODULES) == modules
    assert {c.conformance_module for c in registry.CHECKS.values()} == modules


def test_the_id_location_table_is_current():
    """docs/development.md's table of where each id lives is the one rendered from the code."""
    from tools import id_locations

    text = id_locations.DOC.read_text()
    assert id_locations.replaced(text, id_locations.render()) == text, (
        "docs/development.md is stale: run `python -m tools.id_locations --write`")
