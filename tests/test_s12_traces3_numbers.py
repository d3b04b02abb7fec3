"""One number grammar for every CSV trace: a plain decimal as a program writes it, finite.
Python's ``float()`` and ``int()`` read more (``1_0`` as 10, ``+5``, other scripts'
digits), and the readers took it; each is now an error naming the file, the line, the
column and the cell."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.capacity import load_capacity
from asyncsync.hetero.compute import read_trace
from asyncsync.hetero.traces import MAX_ID, TraceError, number

GRAMMAR = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
"""The grammar the docs state, written independently of the reader."""

READERS: dict[str, tuple[str, Callable[[Path], object]]] = {
    # name: (a header and a row whose second figure is {}, the reader)
    "availability": ("worker,online_from_s,online_to_s\n0,{},50\n",
                     lambda path: load_availability(path, 4)),
    "capacity": ("worker,up_mbps,s_per_sample,down_mbps\n0,{},0.5,8\n", load_capacity),
    "compute": ("time_s,worker,factor\n{},0,2\n", lambda path: read_trace(path, 4)),
}
COLUMN = {"availability": "online_from_s", "capacity": "up_mbps", "compute": "time_s"}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(("cell", "problem"), [
    ("1_0", "is not a number"), ("+5", "is not a number"),
    ("\u0661\u0662", "is not a number"),  # Arabic-Indic 12
    ("\uff11", "is not a number"),  # a fullwidth 1
    ("0x10", "is not a number"), ("1.5.2", "is not a number"), ("", "is not a number"),
    ("1e400", "is not finite"), ("nan", "is not finite"), ("-Infinity", "is not finite"),
])
def test_a_cell_outside_the_grammar_names_file_line_column_and_cell(
        tmp_path: Path, reader: str, cell: str, problem: str) -> None:
    template, read = READERS[reader]
    path = tmp_path / "t.csv"
    path.write_text(template.format(cell), encoding="utf-8")
    with pytest.raises(TraceError) as caught:
        read(path)
    assert str(caught.value).startswith(f"{path}:2: {COLUMN[reader]} {cell!r} {problem}")


@pytest.mark.parametrize(("cell", "value"), [
    ("12", 12.0), ("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("1e-3", 0.001),
    ("1E+01", 10.0), (" 7 ", 7.0), ("007", 7.0),
])
def test_plain_decimals_read_as_before(tmp_path: Path, cell: str, value: float) -> None:
    path = tmp_path / "a.csv"
    path.write_text(f"worker,online_from_s,online_to_s\n1,{cell},50\n")
    assert load_availability(path, 2)[1].intervals == ((value, 50.0),)


def test_the_reader_takes_exactly_the_documented_grammar() -> None:
    """Seeded strings over the characters that matter (and some that only float() takes):
    the reader accepts one exactly when the grammar matches it."""
    rng = random.Random(12)
    alphabet = ["0", "1", "9", ".", "-", "+", "e", "E", "_", "\u0661", "i", "n", "f", "a"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        try:
            value: float | None = number("t.csv", 2, {"x": text}, "x")
        except TraceError:
            value = None
        expected = float(text) if GRAMMAR.fullmatch(text) else None
        if expected is not None and not math.isfinite(expected):
            expected = None
        assert value == expected, text


@pytest.mark.parametrize(("cell", "problem"), [
    ("1_0", "is not an integer"), ("+1", "is not an integer"), ("\u0661", "is not an integer"),
    ("1.0", "is not an integer"), ("1e0", "is not an integer"),
    ("-3", "is negative"), (str(MAX_ID + 1), "is beyond any id"),
    ("9" * 5000, "is beyond any id"),  # (int() refused it as "not an integer")
])
def test_a_rank_or_id_outside_the_grammar_is_refused(tmp_path: Path, cell: str,
                                                      problem: str) -> None:
    path = tmp_path / "c.csv"
    path.write_text(f"worker,s_per_sample,up_mbps,down_mbps\n{cell},0.5,1,2\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:2: worker .*{problem}"):
        load_capacity(path)


def test_the_largest_id_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(f"worker,s_per_sample,up_mbps,down_mbps\n{MAX_ID},0.5,1,2\n")
    assert [row.row for row in load_capacity(path)] == [2**63 - 1]


def test_a_row_of_numbers_for_a_header_says_the_header_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("0,0,5\n1,2,3\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:1: no header: the first "
                                         "row must name the columns"):
        load_availability(path, 2)
