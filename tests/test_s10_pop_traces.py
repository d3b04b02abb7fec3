"""A CSV trace's rows are its lines: every malformed row is one error naming the file and
the line an editor shows, never a bare exception, a row joined with the next or a
megabyte-long message."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.capacity import load_capacity
from asyncsync.hetero.traces import SHOWN_CHARS, TraceError

AVAILABILITY_HEADER = "worker,online_from_s,online_to_s\n"
CAPACITY_HEADER = "worker,s_per_sample,up_mbps,down_mbps\n"


def test_a_quote_left_open_names_its_line_in_an_availability_trace(tmp_path: Path) -> None:
    """Line 3 opens a quote that line 4 closes: the rows were joined (reading the interval
    [10, 200) that no line holds) and the reader then failed on a bare zip() error."""
    trace = tmp_path / "a.csv"
    trace.write_text(AVAILABILITY_HEADER + '1,0,5\n0,"1\n0",200\n')
    with pytest.raises(TraceError) as caught:
        load_availability(trace, 4)
    assert caught.value.line == 3
    assert str(caught.value).startswith(f"{trace}:3: ")


def test_a_quote_left_open_names_its_line_in_a_capacity_trace(tmp_path: Path) -> None:
    trace = tmp_path / "c.csv"
    trace.write_text(CAPACITY_HEADER + '0,0.1,"1\n0",5\n1,0.2,3,4\n')
    with pytest.raises(TraceError) as caught:
        load_capacity(trace)
    assert caught.value.line == 2


def test_a_field_over_the_csv_limit_is_an_error_naming_the_line(tmp_path: Path) -> None:
    """A cell of 200,000 characters raised the csv module's own error, without the file."""
    trace = tmp_path / "a.csv"
    trace.write_text(AVAILABILITY_HEADER + "0,0,5\n0,10," + "9" * 200_000 + "\n")
    with pytest.raises(TraceError) as caught:
        load_availability(trace, 4)
    assert caught.value.line == 3


@pytest.mark.parametrize("separator", ["\x0c", "\x0b", "\x1c", "\u2028", "\x85"])
def test_lines_are_numbered_as_an_editor_numbers_them(tmp_path: Path, separator: str) -> None:
    """A stray control character inside a cell (blank space to `float`) is no line break:
    the bad row after it is on line 4 (splitlines() broke line 3 there, and named line 5)."""
    trace = tmp_path / "a.csv"
    trace.write_text(AVAILABILITY_HEADER + f"0,0,5\n1,3{separator},4\n2,x,6\n",
                     encoding="utf-8")
    with pytest.raises(TraceError) as caught:
        load_availability(trace, 4)
    assert caught.value.line == 4
    assert "online_from_s 'x'" in caught.value.problem


def test_windows_and_old_mac_line_ends_read_as_unix_ones(tmp_path: Path) -> None:
    trace = tmp_path / "a.csv"
    trace.write_bytes(b"worker,online_from_s,online_to_s\r\n0,0,5\r1,2,3\r\n")
    times = load_availability(trace, 2)
    assert [t.intervals for t in times] == [((0.0, 5.0),), ((2.0, 3.0),)]


def test_a_huge_cell_is_quoted_short_in_the_error(tmp_path: Path) -> None:
    trace = tmp_path / "a.csv"
    trace.write_text(AVAILABILITY_HEADER + "x" * 100_000 + ",0,5\n")
    with pytest.raises(TraceError) as caught:
        load_availability(trace, 4)
    assert len(caught.value.problem) < SHOWN_CHARS + 40
    assert caught.value.line == 2
