"""Reading a population's plain-text traces (CSV): the rows, and errors that name the place.

A trace is a CSV file with a header row naming its columns; blank lines and lines that
start with ``#`` (comments, e.g. where the rows came from) are skipped. Every problem is a
`TraceError` naming the file, the line and what is wrong, so the CLI prints it as one
``error:`` line.

**(choice)** One row is one line: lines end at ``\n``, ``\r\n`` or ``\r`` only (as an
editor numbers them), and a quoted field cannot span lines (a quote left open at the end
of a line is an error naming it, rather than a row silently joined with the next).

**(choice)** A number is written as a program writes it, in one grammar for every reader:
ASCII digits with an optional leading ``-``, point and exponent (``12``, ``-0.5``,
``.5``, ``1e-3``, ``1E+06``), and finite. Python's ``float()`` and ``int()`` also take
``1_0`` (as 10), ``+5``, ``inf``, ``nan`` and other scripts' digits (``\u0661\u0662`` as 12);
a trace refuses them, naming the file, the line, the column and the cell. White space
around a cell (a hand-aligned file) is ignored, as it is around a column's name. A rank
or an id is the same without point or exponent, at most `MAX_ID`.

**(choice)** A trace is a regular file: a pipe or a device (``/dev/zero``, a FIFO) is
refused rather than read until it ends, which may be never.
"""

from __future__ import annotations

import csv
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from asyncsync.errors import InputError

SHOWN_CHARS = 40
"""The most characters of a cell an error message shows (a cell may be megabytes)."""
MAX_ID = 2**63 - 1
"""The largest rank or row id read (FedScale's client ids are 64-bit integers)."""
_LINE_END = re.compile(r"\r\n|\r|\n")
_HINTED = 16
"""The longest cell whose error says what a number looks like (a longer one is no near miss,
and its message stays one short line)."""
_GRAMMAR = "ASCII digits, an optional '-', point and exponent, e.g. 12, -0.5, 1e-3"


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
    lines = content_lines(read_text(path))
    if not lines:
        raise TraceError(path, 1, f"empty trace: expected a header ({', '.join(required)})")
    rows = _csv_lines(path, lines)
    head_line, names = next(rows)
    header = [name.strip() for name in names]
    numbers = [name for name in header if _plain_float(name) is not None]
    if numbers:
        raise TraceError(path, head_line, f"no header: the first row must name the columns "
                                          f"({', '.join(required)}), not hold numbers "
                                          f"({shown(numbers[0])})")
    repeated = _first_repeat(header)
    if repeated is not None:
        raise TraceError(path, head_line, f"column {shown(repeated)} repeats")
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
    for number, cells in rows:
        if len(cells) != len(header):
            raise TraceError(path, number, f"{len(cells)} fields, the header has "
                                           f"{len(header)}")
        yield number, {name: cell.strip() for name, cell in zip(header, cells, strict=True)}


def _first_repeat(names: list[str]) -> str | None:
    """The first of `names` that an earlier one repeats (None: none does), in linear time
    (a header may hold a million names)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def read_bytes(path: str | Path) -> bytes:
    """The bytes of the regular file `path` (anything else is a `TraceError`)."""
    try:
        _check_regular(path)
        return Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(path, 0, unreadable(path, exc)) from exc


def read_text(path: str | Path) -> str:
    """The UTF-8 text of the regular file `path`, a leading byte order mark dropped (a
    spreadsheet's BOM is no column)."""
    try:
        _check_regular(path)
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(path, 0, unreadable(path, exc)) from exc
    except UnicodeDecodeError as exc:
        raise TraceError(path, 0, f"not UTF-8 text (byte {exc.start}): a trace is a CSV "
                                  "file") from None


def _check_regular(path: str | Path) -> None:
    """Refuse a pipe, a device or a folder before it is opened (opening a FIFO waits for a
    writer; ``/dev/zero`` never ends)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise TraceError(path, 0, "not a regular file: a trace is a file, not a pipe, a "
                                  "device or a folder")


def content_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a trace's text that are neither blank nor comments, with their numbers
    (counted as an editor counts them: see the module docstring)."""
    return [(number, line) for number, line in enumerate(_LINE_END.split(text), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _csv_lines(path: str | Path, lines: list[tuple[int, str]],
               ) -> Iterator[tuple[int, list[str]]]:
    """The fields of each of `lines` (numbered), each read as one CSV row: one reader for
    all of them (a reader a line costs twice the time), which must take one line a row."""
    reader = csv.reader((line for _, line in lines), strict=True)
    for index, (number, _) in enumerate(lines):
        try:
            cells = next(reader)
        except csv.Error as exc:
            raise TraceError(path, number, f"not a CSV row: {exc}") from None
        if reader.line_num != index + 1:
            raise TraceError(path, number, "not a CSV row: a quote is left open at the end "
                                           "of the line")
        yield number, cells


def _short(text: str) -> str:
    """A cell of plain digits as an error message shows it: as written, or `shown` when long."""
    return text if len(text) < SHOWN_CHARS else shown(text)


def _hint(text: str, grammar: str) -> str:
    """What a number looks like, for an error about a short cell (one that nearly is)."""
    return f" ({grammar})" if len(text) <= _HINTED else ""


def shown(text: str) -> str:
    """A cell as an error message quotes it: its repr, cut to `SHOWN_CHARS` characters."""
    quoted = repr(text)
    return quoted if len(quoted) <= SHOWN_CHARS else quoted[:SHOWN_CHARS - 3] + "..."


def _plain_float(text: str) -> float | None:
    """The value of `text` (a stripped cell) if it is written in the module docstring's
    grammar, else None. ``float()`` reads that grammar and more; the more is a leading
    ``+``, ``_``, and characters that are not ASCII (other scripts' digits), refused
    here, and ``inf``/``nan``, which are not finite."""
    if not text.isascii() or "_" in text or text.startswith("+"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def number(path: str | Path, line: int, row: dict[str, str], column: str) -> float:
    """Column `column` of a row as a finite number (see the module docstring)."""
    text = row[column]
    value = _plain_float(text)
    if value is None:
        raise TraceError(path, line, f"{column} {shown(text)} is not a number"
                                     f"{_hint(text, _GRAMMAR)}")
    if not math.isfinite(value):
        raise TraceError(path, line, f"{column} {shown(text)} is not finite")
    return value


def rank_of(path: str | Path, line: int, row: dict[str, str], workers: int | None,
            column: str = "worker") -> int:
    """Column `column` of a row as a worker's rank (or a row's id), below `workers` when
    given, else at most `MAX_ID`."""
    text = row[column]
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise TraceError(path, line, f"{column} {shown(text)} is not an integer"
                                     f"{_hint(text, 'ASCII digits, e.g. 0, 12')}")
    if text.startswith("-") and digits.strip("0"):
        raise TraceError(path, line, f"{column} {_short(text)} is negative")
    if len(digits.lstrip("0")) > len(str(MAX_ID)) or int(digits) > MAX_ID:
        raise TraceError(path, line, f"{column} {shown(text)} is beyond any id (at most "
                                     f"{MAX_ID})")
    rank = int(digits)
    if workers is not None and rank >= workers:
        raise TraceError(path, line, f"unknown worker {rank}: the run has workers "
                                     f"0..{workers - 1}")
    return rank


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: into a temporary file beside it, then
    renamed over it, so that a write cut short (a full disk) leaves the old file as it
    was rather than a shorter trace that still reads as a valid one. An OSError names
    `path`, not the temporary file."""
    target = Path(path)
    try:
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as exc:
        raise _naming(exc, target) from None
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(handle, 0o666 & ~umask)  # (as a plain write would create it)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _naming(exc, target) from None
        raise


def _naming(exc: OSError, target: Path) -> OSError:
    """`exc` (of its errno's class) naming `target`."""
    return OSError(exc.errno, exc.strerror or str(exc), str(target))
