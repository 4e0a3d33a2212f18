"""What a baseline loader got on the same checks, beside this run's outcomes.

A loader that subclasses torch's ``DataLoader`` inherits torch's failures; its
author needs to see which failures are theirs. ``--workerstart-baseline=torch``
uses the torch verdict shipped in the package (recorded by ``make
conformance-torch``, full profile); any other value is a stored verdict file.
Cases are matched by check id and parameters (``failure.parent_start_error[spawn-first]``),
so verdicts written from another directory still line up.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_workerstart.verdict import case_key

#: Baselines shipped with the package: name -> file next to this module.
SHIPPED = {"torch": "baselines/torch.json"}


class BaselineError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Baseline:
    source: str
    loader: dict[str, Any]
    torch: str | None
    profile: str | None
    #: case key -> outcome, for the baseline's finished checks
    outcomes: dict[str, str]

    def outcome(self, nodeid: str, check_id: str) -> str | None:
        return self.outcomes.get(case_key(nodeid, check_id))

    def describe(self) -> str:
        loader = self.loader.get("spec", "?")
        version = self.loader.get("version", "?")
        return f"{loader} {version} ({self.source}, {self.profile or '?'} profile, torch {self.torch or '?'})"

    def compare(self, records: Iterable[Any]) -> dict[str, list[str]]:
        """Failed/errored cases split into ``same`` (the baseline failed too), ``new``
        (the baseline passed), ``unknown`` (the baseline skipped or lacks the case);
        plus ``fixed``: cases the baseline failed that pass here."""
        out: dict[str, list[str]] = {"same": [], "new": [], "unknown": [], "fixed": []}
        for r in records:
            if r.state != "finished":
                continue
            key, base = case_key(r.nodeid, r.id), self.outcome(r.nodeid, r.id)
            bad, base_bad = r.outcome in ("failed", "error"), base in ("failed", "error")
            if bad:
                out["same" if base_bad else "new" if base in ("passed", "xfailed") else "unknown"].append(key)
            elif r.outcome == "passed" and base_bad:
                out["fixed"].append(key)
        return {k: sorted(v) for k, v in out.items()}


def path_of(value: str) -> Path:
    """The file a ``--workerstart-baseline`` value names (shipped name or path)."""
    if value in SHIPPED:
        return Path(__file__).resolve().parent / SHIPPED[value]
    return Path(value).expanduser()


def load(value: str) -> Baseline:
    path = path_of(value)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"no such verdict file {str(path)!r}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"{str(path)!r} is not a readable JSON verdict ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("checks"), list) or "loader" not in data:
        raise BaselineError(f"{str(path)!r} is not a workerstart verdict (no 'loader' and 'checks')")
    outcomes = {case_key(c["nodeid"], c["id"]): c["outcome"] for c in data["checks"]
                if c.get("state", "finished") == "finished" and c.get("outcome")}
    source = f"shipped {value} verdict" if value in SHIPPED else str(path)
    return Baseline(source=source, loader=data["loader"], torch=(data.get("machine") or {}).get("torch"),
                    profile=(data.get("settings") or {}).get("profile"), outcomes=outcomes)
