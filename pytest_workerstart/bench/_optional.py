"""Optional packages of the benchmark: refused in one line that names the extra, never a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, purpose: str, extra: str = "bench") -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SystemExit(f"error: {purpose} needs {module.split('.')[0]}, which is not installed: "
                         f"pip install 'pytest-workerstart[{extra}]'") from None
