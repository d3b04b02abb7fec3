"""Reading a population's plain-text traces (CSV): the rows, and errors that name the place.

A trace is a CSV file with a header row naming its columns; blank lines and lines that
start with ``#`` (comments, e.g. where the rows came from) are skipped. Every problem is a
`TraceError` naming the file, the line and what is wrong, so the CLI prints it as one
``error:`` line.

**(choice)** One row is one line: lines end at ``\n``, ``\r\n`` or ``\r`` only (as an
editor numbers them), and a quoted field cannot span lines (a quote left open at the end
of a line is an error naming it, rather than a row silently joined with the next).
"""

from __future__ import annotations

import csv
import math
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from asyncsync.errors import InputError

SHOWN_CHARS = 40
"""The most characters of a cell an error message shows (a cell may be megabytes)."""
_LINE_END = re.compile(r"\r\n|\r|\n")


class TraceError(InputError, ValueError):
    """A malformed trace: ``<file>:<line>: <problem>``, or ``<file>: <problem>`` where it
    has no lines (`line` 0: a pickle, or the file as a whole)."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


def unreadable(path: str | Path, exc: OSError) -> str:
    """Why `path` cannot be read, saying where a relative path was looked for (a recipe's
    trace paths are read from the working directory, not the recipe's folder)."""
    where = "" if Path(path).is_absolute() else f" (looked for in {Path.cwd()})"
    return f"cannot read: {exc.strerror or exc}{where}"


def csv_rows(path: str | Path, required: Sequence[str], optional: Sequence[str] = (),
             ) -> Iterator[tuple[int, dict[str, str]]]:
    """The data rows of a CSV trace with their line numbers, as ``{column: text}`` of the
    known columns present (a file that is not UTF-8 text, a missing, repeated or unknown
    column, no row after the header, or a row of the wrong width is a `TraceError`)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a spreadsheet's BOM is no column
    except OSError as exc:
        raise TraceError(path, 0, unreadable(path, exc)) from exc
    except UnicodeDecodeError as exc:
        raise TraceError(path, 0, f"not UTF-8 text (byte {exc.start}): a trace is a CSV "
                                  "file") from None
    lines = content_lines(text)
    if not lines:
        raise TraceError(path, 1, f"empty trace: expected a header ({', '.join(required)})")
    head_line = lines[0][0]
    header = [name.strip() for name in _cells(path, *lines[0])]
    repeated = [name for index, name in enumerate(header) if name in header[:index]]
    if repeated:
        raise TraceError(path, head_line, f"column {shown(repeated[0])} repeats")
    unknown = [name for name in header if name not in (*required, *optional)]
    if unknown:
        raise TraceError(path, head_line, f"unknown column {shown(unknown[0])} (known: "
                                          f"{', '.join((*required, *optional))})")
    missing = [name for name in required if name not in header]
    if missing:
        raise TraceError(path, head_line, f"missing column {missing[0]!r} (the header must "
                                          f"name {', '.join(required)})")
    if len(lines) == 1:
        raise TraceError(path, head_line, "no rows after the header: a trace needs at least "
                                          "one")
    for number, line in lines[1:]:
        cells = _cells(path, number, line)
        if len(cells) != len(header):
            raise TraceError(path, number, f"{len(cells)} fields, the header has "
                                           f"{len(header)}")
        yield number, {name: cell.strip() for name, cell in zip(header, cells, strict=True)}


def content_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a trace's text that are neither blank nor comments, with their numbers
    (counted as an editor counts them: see the module docstring)."""
    return [(number, line) for number, line in enumerate(_LINE_END.split(text), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _cells(path: str | Path, number: int, line: str) -> list[str]:
    """The fields of line `number` of a trace, read as one CSV row."""
    try:
        return next(csv.reader([line], strict=True))
    except csv.Error as exc:
        raise TraceError(path, number, f"not a CSV row: {exc}") from None


def shown(text: str) -> str:
    """A cell as an error message quotes it: its repr, cut to `SHOWN_CHARS` characters."""
    quoted = repr(text)
    return quoted if len(quoted) <= SHOWN_CHARS else quoted[:SHOWN_CHARS - 3] + "..."


def number(path: str | Path, line: int, row: dict[str, str], column: str) -> float:
    """Column `column` of a row as a finite number."""
    text = row[column]
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, f"{column} {shown(text)} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(path, line, f"{column} {shown(text)} is not finite")
    return value


def rank_of(path: str | Path, line: int, row: dict[str, str], workers: int | None,
            column: str = "worker") -> int:
    """Column `column` of a row as a worker's rank, below `workers` when given."""
    text = row[column]
    try:
        rank = int(text)
    except ValueError:
        raise TraceError(path, line, f"{column} {shown(text)} is not an integer") from None
    if rank < 0:
        raise TraceError(path, line, f"{column} {rank} is negative")
    if workers is not None and rank >= workers:
        raise TraceError(path, line, f"unknown worker {rank}: the run has workers "
                                     f"0..{workers - 1}")
    return rank


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: into a temporary file beside it, then
    renamed over it, so that a write cut short (a full disk) leaves the old file as it
    was rather than a shorter trace that still reads as a valid one."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(handle, 0o666 & ~umask)  # (as a plain write would create it)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
