"""The code blocks of README.md and the documentation pages under docs/, for the tests that
run them.

A fenced block's test is chosen by an HTML comment on the line before it (invisible on the
page):

- ``<!-- test: run -->``: tests/test_docs.py runs each command of the block as written;
- ``<!-- test: skip: REASON -->``: not run, for the reason given (its ``asyncsync`` lines
  are still parsed by the CLI and the files they name must exist);
- ``<!-- NAME -->`` ... ``<!-- /NAME -->`` around a block: a named example, run by the test
  that reads it with `named_block` (tests/test_docs.py checks that some test does).

An unmarked ``python`` block is run as a script, an unmarked ``toml`` block is parsed (and
loaded as a recipe when it has runs), an unmarked shell block is checked as a skipped one
is, and blocks in ``text`` (or no language), ``json``, ``csv`` and the like are output or
data, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELLS = frozenset({"bash", "sh", "shell", "console"})
OUTPUT = frozenset({"", "text", "output", "json", "jsonl", "csv", "yaml", "ini", "log", "diff"})
"""Languages of blocks that show output or data, not something to run."""
_ALIASES = {"py": "python", "python3": "python", "shell-session": "console", "zsh": "sh"}
_FENCE = re.compile(r"^(?P<indent> {0,4})(?P<fence>`{3,})(?P<lang>[\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    code: str
    mark: str
    """The comment on the line before it ("test: run", "test: skip: ...", a name) or ""."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def named(self) -> str | None:
        """The example's name, when the block sits between ``<!-- NAME -->`` markers."""
        return None if not self.mark or self.mark.startswith("test:") else self.mark


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (generated pages are not files)."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                       if "hooks" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of `page`, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        start = _FENCE.match(lines[index])
        if not start:
            index += 1
            continue
        indent, fence = start["indent"], start["fence"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line.removeprefix(indent) for line in lines[index + 1:end])
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        mark = _MARK.match(before)
        lang = start["lang"].lower()
        found.append(Block(page, index + 1, _ALIASES.get(lang, lang), code + "\n",
                           mark["body"] if mark else ""))
        index = end + 1
    return found


def stray_fences(text: str) -> list[tuple[int, str]]:
    """The lines of a page (number, line) that start like a fence but are not one, e.g. a
    closing fence with prose after it, which leaves its block open: the page renders as code
    up to the next fence, and every later block is read with its fences paired wrongly."""
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1)
            if re.match(r" {0,4}`{3}", line) and not _FENCE.match(line)]


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def named_block(name: str) -> str:
    """The code of the example between ``<!-- name -->`` and ``<!-- /name -->``, wherever
    the pages keep it (exactly one page must)."""
    found = [b for b in all_blocks() if b.named == name]
    assert len(found) == 1, f"example {name!r}: found {[b.where for b in found]}"
    return found[0].code
