"""A part of a docs page rendered from the code: the text between two marker lines.

Each renderer names its page, its markers and its ``render()``; ``python -m tools.NAME`` prints
the part and ``--write`` replaces it in the page; a self-test asserts :meth:`Part.current`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclasses.dataclass(frozen=True)
class Part:
    page: Path
    begin: str
    end: str
    render: Callable[[], str]

    def replaced(self, text: str, body: str) -> str:
        head, found, rest = text.partition(self.begin)
        _, closed, tail = rest.partition(self.end)
        if not found or not closed:
            raise LookupError(f"{self.page}: no markers ({self.begin} ... {self.end})")
        return f"{head}{self.begin}{body}{self.end}{tail}"

    def current(self) -> bool:
        text = self.page.read_text()
        return self.replaced(text, self.render()) == text

    def main(self, argv: list[str]) -> int:
        body = self.render()
        if argv == ["--write"]:
            self.page.write_text(self.replaced(self.page.read_text(), body))
        else:
            sys.stdout.write(body)
        return 0
