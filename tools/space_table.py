"""docs/contract.md's configuration-space tables, rendered from :mod:`pytest_workerstart.space`.

The page shows what runs: each space's dimensions, corners (with their profiles and why) and
explored region, every dimension of a point with its values, and the ``DataLoader`` keywords
that are no dimension with why. ``python -m tools.space_table --write`` rewrites the part of the
page between the markers; a self-test fails when they differ.
"""

from __future__ import annotations

import inspect
import sys

from pytest_workerstart import point, space
from tools.rendered import DOCS, Part

#: the values each dimension takes where a point is drawn (the corners may go beyond)
_VALUES = {
    "num_workers": "1..6 (spawn: 1..3); corners up to 2 x (cores + 1)", "parallelism":
    "1..min(N + 1, cores + 2) where parallel start is declared, else none", "length": "1..40",
    "batch_size": "none, 1..5", "prefetch_factor": "none, 1..4", "epochs": "1..3", "generator": "none, 0..65535",
    "timeout": "0, 30", "schedule": "a permutation of the N workers where p > 1 and N > 1, else none",
}


def _shown(value) -> str:
    return "none" if value is None else str(int(value)) if isinstance(value, bool) else str(value)


def _values(name: str) -> str:
    if name in _VALUES:
        return _VALUES[name]
    if name in point.CHOICES:
        default = point.DEFAULTS[name]
        return ", ".join(([] if default in point.CHOICES[name] else [_shown(default)]) + list(point.CHOICES[name]))
    kind = str(point.Point.__dataclass_fields__[name].type)
    return "none, 0, 1" if "None" in kind else "0, 1"


def _corner(c: space.Corner, dims: tuple[str, ...]) -> str:
    where = "" if c.profiles == ("quick", "full") else f" ({' and '.join(c.profiles)} profile)"
    if c.quick_contexts and "quick" in c.profiles:
        where += f" (quick profile: under {', '.join(c.quick_contexts)})"
    at = f"`{c.point.text(dims)}`" if c.point is not None else \
        f"derived from the usable cores ({inspect.getdoc(c.derive).rstrip('.')}; 2 cores: `{c.resolve(2).text(dims)}`)"
    return f"`{c.id}`{where}: {at}" + (f": {c.why}" if c.why else "")


def render() -> str:
    lines = ["", "", "| check | dimensions | fixed corners | explored |", "|---|---|---|---|"]
    data = [s for s in space.SPACES.values() if s.stream == "data"]
    for sp in (s for s in space.SPACES.values() if s.stream is None):
        dims = ", ".join(point.DIMENSIONS[d][0] for d in sp.dims)
        corners = "; ".join(_corner(c, sp.dims) for c in sp.corners)
        lines.append(f"| `{sp.check_id}` | {dims} | {corners} | drawn and shrunk by hypothesis |")
    own = ["`{}`: {}".format(s.check_id, "; ".join(_corner(c, s.dims) for c in s.corners
                                                   if c not in space.DATA_CORNERS))
           for s in data if len(s.corners) > len(space.DATA_CORNERS)]
    corners = [_corner(c, space.DATA_DIMS) for c in space.DATA_CORNERS] + own
    lines.append("| " + ", ".join(f"`{s.check_id}`" for s in data) + " | every dimension below | "
                 + "; ".join(corners) + " | one shared stream of uniform draws, every dimension |")
    lines += ["", "Every dimension of a point (its key in a point's text, what it is, the values drawn):", "",
              "| key | dimension | values |", "|---|---|---|"]
    for name, (key, what) in point.DIMENSIONS.items():
        lines.append(f"| `{key}` | {what} | {_values(name)} |")
    lines += ["", "`DataLoader` keywords that are no dimension:", "", "| keyword | why |", "|---|---|"]
    lines += [f"| `{k}` | {why} |" for k, why in space.OUT_OF_SCOPE.items()]
    return "\n".join([*lines, "", ""])


PART = Part(DOCS / "contract.md", "<!-- rendered from pytest_workerstart/space.py: python -m tools.space_table -->",
            "<!-- end of the rendered tables -->", render)


if __name__ == "__main__":
    sys.exit(PART.main(sys.argv[1:]))
