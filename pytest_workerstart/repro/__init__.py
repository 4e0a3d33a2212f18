"""Standalone reproducers: scripts that show one clause of the contract outside the suite.

Each script in this package is named after the check id it shows (``failure.parent_start_error``
-> ``failure_parent_start_error.py``), needs only torch and the standard library, builds the loader
given on its command line (default: its ``LOADER`` line) as the check does, injects the fault with
a multiprocessing context or a ``worker_init_fn``, prints what it observed against what the clause
expects, and exits 1 on a loader that breaks the clause, 0 on one that meets it.
:func:`write` copies the scripts of failed ids for ``--workerstart-repro=DIR``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from pytest_workerstart import registry

HERE = Path(__file__).resolve().parent
_LOADER_LINE = re.compile(r'^LOADER = ".*"$', flags=re.M)


def script_name(check_id: str) -> str:
    return check_id.replace(".", "_") + ".py"


def available() -> dict[str, Path]:
    """Check id -> its reproducer, for the ids that have one."""
    return {i: HERE / script_name(i) for i in registry.CHECKS if (HERE / script_name(i)).is_file()}


def source(check_id: str, loader: str) -> str:
    """The reproducer of ``check_id`` with ``loader`` (``module:attribute``) as its default loader."""
    text = available()[check_id].read_text()
    return _LOADER_LINE.sub(lambda _: f"LOADER = {json.dumps(loader)}", text, count=1)


def write(directory: Path, check_ids: Iterable[str], loader: str) -> tuple[dict[str, str], list[str]]:
    """Write the reproducer of each id into ``directory``: (id -> file written, ids without one)."""
    have = available()
    written, missing = {}, []
    for check_id in sorted(set(check_ids)):
        if check_id not in have:
            missing.append(check_id)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / script_name(check_id)
        path.write_text(source(check_id, loader))
        written[check_id] = str(path)
    return written, missing
