"""The values a ``--workerstart-*`` setting may take: each converter gets the raw value and
where it came from (``--flag``, ``$ENV``, ``ini key``), and a bad value is one usage error line
that names its source, never a traceback."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import baseline, space

KNOWN_CONTEXTS = ("spawn", "forkserver", "fork")
PROFILES = ("quick", "full")
#: ``check.id``, ``check.id[context]`` or ``check.id[context-case]`` (the node id's
#: parameters after the check id, e.g. ``failure.parent_start_error[spawn-middle]``).
_XFAIL_LINE = re.compile(r"^(?P<id>[a-z_]+\.[a-z_]+)(\[(?P<ctx>[a-z]+(-[\w.-]+)?)\])?\s*:\s*(?P<reason>.*)$")


def usage_error(where: str, msg: str) -> pytest.UsageError:
    return pytest.UsageError(f"{where}: {msg}")


# --- converters: (raw value, where it came from) -> value ---------------------


def text(value: str, where: str) -> str:
    value = value.strip()
    if not value:
        raise usage_error(where, "empty value")
    return value


def _number(value: Any, where: str, expected: str, ok: Callable[[float], bool]) -> float:
    """``value`` as a finite float that ``ok`` accepts, else a usage error saying what was ``expected``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number != number or number in (float("inf"), float("-inf")) or not ok(number):
        raise usage_error(where, f"expected {expected}, got {value!r}")
    return number


def positive_float(value: Any, where: str) -> float:
    return _number(value, where, "a positive finite number", lambda n: n > 0)


def boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise usage_error(where, f"expected true or false, got {value!r}")


def count(value: Any, where: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise usage_error(where, f"expected a whole number >= 0, got {value!r}") from None
    if number < 0:
        raise usage_error(where, f"expected a whole number >= 0, got {value!r}")
    return number


def seconds(value: Any, where: str) -> float:
    """A number of seconds >= 0 (0: off)."""
    return _number(value, where, "a number of seconds >= 0", lambda n: n >= 0)


def point(value: Any, where: str) -> str:
    try:
        return space.parse(str(value)).text()
    except space.PointError as exc:
        raise usage_error(where, f"not a point: {exc}") from None


def jobs(value: Any, where: str) -> int | None:
    """``auto`` (None: decided by the session) or a whole number >= 1."""
    if str(value).strip().lower() == "auto":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise usage_error(where, f"expected 'auto' or a whole number >= 1, got {value!r}")
    return number


def profile(value: str, where: str) -> str:
    value = value.strip()
    if value not in PROFILES:
        raise usage_error(where, f"expected one of {', '.join(PROFILES)}, got {value!r}")
    return value


def contexts(value: str, where: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in str(value).split(",") if v.strip())
    if not names:
        raise usage_error(where, f"give at least one of {', '.join(KNOWN_CONTEXTS)}")
    for name in names:
        if name not in KNOWN_CONTEXTS:
            raise usage_error(where, f"unknown context {name!r}: choose from {', '.join(KNOWN_CONTEXTS)}")
    return tuple(dict.fromkeys(names))


def capabilities(values: Any, where: str) -> tuple[str, ...]:
    items = values.splitlines() if isinstance(values, str) else list(values)
    out = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if "=" not in item:
            raise usage_error(where, f"capability {item!r}: expected NAME=VALUE")
        out.append(item)
    return tuple(out)


def json_path(value: str, where: str) -> Path:
    p = Path(value).expanduser().resolve()
    if p.is_dir():
        raise usage_error(where, f"{str(p)!r} is a directory")
    if not p.parent.is_dir():
        raise usage_error(where, f"directory {str(p.parent)!r} does not exist")
    if (p.exists() and not os.access(p, os.W_OK)) or not os.access(p.parent, os.W_OK):
        raise usage_error(where, f"{str(p)!r} is not writable")
    return p


def directory(value: str, where: str) -> Path:
    p = Path(value).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise usage_error(where, f"{str(p)!r} is not a directory")
    if not p.exists() and not p.parent.is_dir():
        raise usage_error(where, f"directory {str(p.parent)!r} does not exist")
    return p


def baseline_name(value: str, where: str) -> str:
    try:
        baseline.load(value)
    except baseline.BaselineError as exc:
        raise usage_error(where, f"expected {' or '.join(baseline.SHIPPED)} or a verdict file: {exc}") from None
    return value


def xfail_file(value: str, where: str) -> tuple[tuple[str, str | None, str], ...]:
    """``check.id[context-case]: reason`` lines -> ((id, "context-case", "context" or None, reason), ...)."""
    p = Path(value).expanduser()
    if not p.is_file():
        raise usage_error(where, f"no such file {value!r}")
    entries = {}
    for lineno, raw in enumerate(p.read_text().splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _XFAIL_LINE.match(line)
        if not m:
            raise usage_error(where, f"{value}:{lineno}: expected 'check.id[context-case]: reason' "
                                f"(context and case optional), got {raw.strip()!r}")
        if not m["reason"].strip():
            raise usage_error(where, f"{value}:{lineno}: expected failure of {m['id']} needs a reason")
        entries[(m["id"], m["ctx"])] = m["reason"].strip()
    return tuple((i, c, r) for (i, c), r in entries.items())
