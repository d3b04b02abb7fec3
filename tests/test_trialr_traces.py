"""Traces written by asyncsync read back, and a capacity header's errors name the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.hetero.availability import OnlineTimes, load_availability, write_availability
from asyncsync.hetero.capacity import load_capacity
from asyncsync.hetero.traces import TraceError


def test_an_interval_shorter_than_the_written_precision_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    times = [OnlineTimes(((1.0, 1.0004), (5.0, 7.5))), OnlineTimes(((0.0, 2.0),))]
    write_availability(path, times)
    loaded = load_availability(path, 2)
    assert loaded[0].intervals == ((5.0, 7.5),)
    assert loaded[1].intervals == ((0.0, 2.0),)


def test_a_capacity_header_without_a_speed_column_is_a_header_error(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("# a comment\nworker,up_mbps,down_mbps\n0,1,1\n")
    with pytest.raises(TraceError) as caught:
        load_capacity(path)
    assert caught.value.line == 2
    assert "s_per_sample" in caught.value.problem and "header" in caught.value.problem
