"""Traces written by asyncsync read back."""

from __future__ import annotations

from pathlib import Path

from asyncsync.hetero.availability import OnlineTimes, load_availability, write_availability
from asyncsync.hetero.traces import TraceError


def test_an_interval_shorter_than_the_written_precision_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    times = [OnlineTimes(((1.0, 1.0004), (5.0, 7.5))), OnlineTimes(((0.0, 2.0),))]
    write_availability(path, times)
    loaded = load_availability(path, 2)
    assert loaded[0].intervals == ((5.0, 7.5),)
    assert loaded[1].intervals == ((0.0, 2.0),)

