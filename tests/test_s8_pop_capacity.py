"""Capacity figures beyond any device: refused naming the file, the line, the column and
the bound (a step or a transfer of some 10^15 virtual seconds stalled the virtual clock:
a 2-second run of s_per_sample = 1e15 ran past 60 s of wall time and did not end)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from asyncsync import cli
from asyncsync.hetero.capacity import Capacity, load_capacity
from asyncsync.hetero.traces import TraceError


@pytest.mark.parametrize(("row", "expected"), [
    ("0,1e15,5,10", "s_per_sample = 1e+15 is beyond any device (at most 1e+06)"),
    ("0,0.01,1e-300,10", "up_mbps = 1e-300 is beyond any device (at least 1e-06)"),
    ("0,0.01,5,1e-9", "down_mbps = 1e-09 is beyond any device (at least 1e-06)"),
])
def test_a_figure_beyond_any_device_names_the_line_the_column_and_the_bound(
        tmp_path: Path, row: str, expected: str) -> None:
    trace = tmp_path / "c.csv"
    trace.write_text(f"worker,s_per_sample,up_mbps,down_mbps\n{row}\n")
    with pytest.raises(TraceError) as caught:
        load_capacity(trace)
    assert str(caught.value) == f"{trace}:2: {expected}"


def test_a_rate_in_flops_below_a_thousand_a_second_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "c.csv"
    trace.write_text("worker,flops_per_s,up_mbps,down_mbps\n0,1e9,5,10\n1,10,5,10\n")
    with pytest.raises(TraceError, match=r":3: flops_per_s = 10 is beyond any device "
                                         r"\(at least 1000\)$"):
        load_capacity(trace)


def test_figures_at_the_bounds_are_read() -> None:
    row = Capacity(0, 1e6, None, 1e-6, 1e300)
    assert (row.s_per_sample, row.up_mbps, row.down_mbps) == (1e6, 1e-6, 1e300)
    with pytest.raises(ValueError, match=r"s_per_sample = 1\.1e\+06 is beyond any device"):
        Capacity(0, 1.1e6, None, 1.0, 1.0)


def test_a_fedscale_device_beyond_the_bounds_is_refused_at_conversion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was written to a trace that every run then hung on."""
    source = tmp_path / "device.pkl"
    source.write_bytes(pickle.dumps({3: {"computation": 162.0, "communication": 5648.0},
                                     8: {"computation": 162.0, "communication": 1e-6}}))
    assert cli.main(["traces", "convert", "capacity", str(source),
                     str(tmp_path / "c.csv")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"error: {source}: client 8 ") and "up_mbps = 1e-09" in out
    assert not (tmp_path / "c.csv").exists()
