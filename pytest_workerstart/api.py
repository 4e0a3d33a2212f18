"""``check_loader``: the suite as a function, for notebooks, scripts and other test runners.

It runs the very session ``pytest --workerstart`` runs (same checks, settings and verdict
file) in a child interpreter, since the suite starts, kills and reaps processes and sets
signal handlers, which the caller's interpreter must not inherit, and returns the verdict
file as a :class:`LoaderVerdict`. The loader must be importable from a fresh interpreter,
as every scenario rebuilds it there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_workerstart import registry, settings
from pytest_workerstart.verdict import case_key


@dataclasses.dataclass(frozen=True)
class Case:
    """One check in one context (one parametrized case of it)."""

    id: str
    context: str | None
    nodeid: str
    state: str
    outcome: str | None
    reason: str
    duration_s: float
    measurements: dict[str, Any] | None
    reproduce: str | None

    @property
    def key(self) -> str:
        """``check.id[context-case]``, the form ``expected_failures`` and ``--workerstart-xfail`` take."""
        return case_key(self.nodeid, self.id)


class LoaderVerdict:
    """The verdict of one :func:`check_loader` run: the JSON file, with accessors."""

    def __init__(self, data: dict[str, Any], output: str, returncode: int):
        self._data = data
        #: the run's terminal output (the verdict table, failures and their reproduce commands)
        self.output = output
        #: pytest's exit status (0 passed, 1 failed, 2 interrupted, 4 usage error or preflight, 5 nothing selected)
        self.returncode = returncode
        self.cases = [Case(**{f.name: c.get(f.name) for f in dataclasses.fields(Case)}) for c in data["checks"]]

    @property
    def outcome(self) -> str:
        """``passed``, ``failed``, ``empty`` (nothing passed) or ``incomplete``."""
        return self._data["outcome"]

    @property
    def complete(self) -> bool:
        return self._data["complete"]

    @property
    def summary(self) -> dict[str, int]:
        return dict(self._data["summary"])

    def with_outcome(self, *outcomes: str) -> list[Case]:
        return [c for c in self.cases if c.outcome in outcomes]

    @property
    def passed(self) -> list[Case]:
        return self.with_outcome("passed")

    @property
    def failed(self) -> list[Case]:
        """Failed cases and errors (a failure outside the check's body)."""
        return self.with_outcome("failed", "error")

    def failed_ids(self) -> set[str]:
        return {c.id for c in self.failed}

    def to_json(self) -> dict[str, Any]:
        """The verdict file's content (the schema in ``verdict.schema.json``)."""
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {o}" for o, n in self.summary.items() if n)
        return f"<LoaderVerdict {self._data['loader'].get('spec')}: {self.outcome} ({counts or 'nothing ran'})>"


def loader_spec(loader: Any) -> str:
    """A SPEC for ``loader``: a SPEC string as given, else the importable ``module:qualname`` of
    a class or function (clear error for one a fresh interpreter cannot import)."""
    if isinstance(loader, str):
        return loader
    module, qualname = getattr(loader, "__module__", None), getattr(loader, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"check_loader takes a SPEC string or a loader class or factory, got {loader!r}")
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(f"{qualname} is defined in {'a function' if '<locals>' in qualname else '__main__'}: "
                         f"every scenario rebuilds the loader in a fresh interpreter, so it must be importable; "
                         f"put it in a module and pass it (or 'module:attribute')")
    return f"{module}:{qualname}"


def _option_args(options: Mapping[str, Any]) -> list[str]:
    args = []
    for field, value in options.items():
        opt = settings.BY_FIELD.get(field)
        if opt is None or field in ("loader", "context", "profile", "xfail", "json"):
            known = sorted(set(settings.BY_FIELD) - {"loader", "context", "profile", "xfail", "json"})
            raise TypeError(f"check_loader() got an unexpected setting {field!r}; settings: {', '.join(known)}")
        if value is not None:
            args += opt.as_args([value] if opt.kind == "list" and isinstance(value, str) else value)
    return args


def _xfail_file(expected: Mapping[str, str] | str | os.PathLike, directory: Path) -> str:
    if isinstance(expected, (str, os.PathLike)):
        return str(expected)
    path = directory / "expected-failures.txt"
    path.write_text("".join(f"{key}: {' '.join(str(reason).split())}\n" for key, reason in expected.items()))
    return str(path)


def check_loader(loader: Any, *, contexts: Iterable[str] | None = None, profile: str = "quick",
                 checks: Iterable[str] | None = None, expected_failures: Mapping[str, str] | str | None = None,
                 json_path: str | os.PathLike | None = None, echo: bool = False, timeout: float | None = None,
                 **options: Any) -> LoaderVerdict:
    """Judge ``loader`` against the contract, as ``pytest --workerstart`` does.

    ``loader``: a SPEC (``"torch"``, ``"mypkg.loaders:MyLoader"``) or an importable loader class
    or factory. ``contexts``: start methods to check (default: every one the platform offers).
    ``checks``: check ids to run (default: all). ``expected_failures``: ``{"check.id[context-case]":
    reason}`` or the path of a ``--workerstart-xfail`` file. ``options``: any other setting by its
    field name (``strict=True``, ``exit_timeout=7``, ``capability=["timeout=false"]``,
    ``baseline="torch"``). ``json_path``: also keep the verdict file there. ``echo``: print the
    run's output as it comes. ``timeout``: seconds after which the run is stopped; the verdict
    then holds what finished (``complete`` false).
    """
    spec = loader_spec(loader)
    args = ["--workerstart", f"--workerstart-loader={spec}", f"--workerstart-profile={profile}"]
    if contexts is not None:
        args.append(f"--workerstart-context={','.join(contexts)}")
    if checks is not None:
        ids = list(checks)
        unknown = [i for i in ids if i not in registry.CHECKS]
        if unknown or not ids:
            raise ValueError(f"unknown check ids {unknown}; known: {', '.join(registry.CHECKS)}" if unknown
                             else "checks: give at least one check id")
        args += ["-k", " or ".join(ids)]
    args += _option_args(options)
    with tempfile.TemporaryDirectory(prefix="workerstart-api-") as tmp:
        directory = Path(tmp)
        if expected_failures:
            args.append(f"--workerstart-xfail={_xfail_file(expected_failures, directory)}")
        out = Path(json_path).resolve() if json_path is not None else directory / "verdict.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, f"--workerstart-json={out}"]
        lines: list[str] = []
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, errors="replace") as proc:
            # SIGTERM: the run's own guard then stops what the suite started; the verdict keeps what finished
            timer = threading.Timer(timeout, proc.terminate) if timeout is not None else None
            if timer is not None:
                timer.start()
            try:
                for line in proc.stdout:
                    lines.append(line)
                    if echo:
                        print(line, end="", flush=True)
                proc.wait()
            except BaseException:  # Ctrl-C in a notebook
                proc.terminate()
                proc.wait()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
        output = "".join(lines)
        if not out.exists():
            raise RuntimeError(f"the suite wrote no verdict (exit status {proc.returncode}):\n{output[-3000:]}")
        return LoaderVerdict(json.loads(out.read_text()), output, proc.returncode)
