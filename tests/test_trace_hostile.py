"""Malformed and hostile trace inputs: each is one error naming the file and the problem,
never a traceback, a hang or a trace that runs later refuse."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from asyncsync import cli
from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.capacity import load_capacity
from asyncsync.hetero.fedscale import read_plain_pickle
from asyncsync.hetero.traces import TraceError


def _self_containing_list() -> bytes:
    """A pickle of a list that contains itself (the memo makes the cycle)."""
    cycle: list[object] = []
    cycle.append(cycle)
    return pickle.dumps({0: {"active": cycle, "inactive": []}}, protocol=2)


def _shared_tower(levels: int) -> bytes:
    """A few hundred bytes that unfold into 2 ** levels references (each level lists the
    one below twice, through the memo)."""
    tower: list[object] = [0]
    for _ in range(levels):
        tower = [tower, tower]
    return pickle.dumps({0: {"active": tower, "inactive": []}}, protocol=2)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("data", [_self_containing_list(), _shared_tower(28)],
                         ids=["cycle", "shared"])
def test_a_pickle_of_shared_or_cyclic_containers_is_read_in_linear_time(
        tmp_path: Path, data: bytes) -> None:
    """The plain-data check visits each container once (it looped forever on a cycle and
    walked each of the 2 ** 28 references of a shared tower, which nests 31 deep, within
    the depth bound)."""
    source = tmp_path / "x.pkl"
    source.write_bytes(data)
    value = read_plain_pickle(source)
    assert isinstance(value, dict) and list(value) == [0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("entry", "problem"), [
    ({"active": ["abc"], "inactive": ["def"], "finish_time": 10}, "'active' and 'inactive'"),
    ({"active": [[1]], "inactive": [5]}, "'active' and 'inactive'"),
    ({"active": [0], "inactive": [5], "finish_time": "x"}, "'finish_time'"),
    ({"active": [float("nan")], "inactive": [5]}, "'active' and 'inactive'"),
    ({"active": [0], "inactive": [float("inf")], "finish_time": 10},
     "'active' and 'inactive'"),
    ({"active": [0], "inactive": [5], "finish_time": float("nan")}, "'finish_time'"),
    ({"active": [0], "inactive": [5], "finish_time": 1e-6}, "intervals"),
])
def test_a_behave_trace_of_bad_times_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object],
        problem: str) -> None:
    """Times that are not finite numbers, and a replay period so short that the horizon
    would hold millions of intervals, are refused naming the client (they were a
    traceback, a silently empty trace, or a conversion that ran out of memory)."""
    source = tmp_path / "behave.pkl"
    source.write_bytes(pickle.dumps({4: entry}))
    assert cli.main(["traces", "convert", "behave", str(source), str(tmp_path / "a.csv"),
                     "--horizon-s", "86400"]) == 2
    out = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    text = " ".join(" ".join(out).split())
    assert text.startswith(f"error: {source}: client 4: ") and problem in text
    assert not (tmp_path / "a.csv").exists()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("horizon", ["inf", "nan", "0"])
def test_a_horizon_that_is_not_a_finite_positive_number_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], horizon: str) -> None:
    source = tmp_path / "behave.pkl"
    source.write_bytes(pickle.dumps({0: {"active": [0], "inactive": [5],
                                         "finish_time": 10}}))
    assert cli.main(["traces", "convert", "behave", str(source), str(tmp_path / "a.csv"),
                     "--horizon-s", horizon]) == 2
    assert "--horizon-s must be" in capsys.readouterr().out
    assert not (tmp_path / "a.csv").exists()


@pytest.mark.parametrize("entry", [{"computation": float("inf"), "communication": 5.0},
                                   {"computation": 5.0, "communication": float("inf")}])
def test_a_capacity_pickle_of_infinite_figures_is_refused_at_conversion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, float]) -> None:
    """It was written as ``inf``, which every run then refused."""
    source = tmp_path / "device.pkl"
    source.write_bytes(pickle.dumps({2: entry}))
    assert cli.main(["traces", "convert", "capacity", str(source),
                     str(tmp_path / "c.csv")]) == 2
    assert f"error: {source}: client 2: " in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "c.csv").exists()


def test_a_trace_that_is_not_text_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError, match=rf"^{path}: .*UTF-8"):
        load_availability(path, 4)


@pytest.mark.parametrize("header", ["worker,online_from_s,online_to_s,worker",
                                    "worker,online_from_s,online_to_s,online_to_s"])
def test_a_repeated_column_is_refused_not_read_from_its_last_copy(
        tmp_path: Path, header: str) -> None:
    """``worker,...,worker`` took the last column's value: the rows went to other ranks."""
    path = tmp_path / "a.csv"
    path.write_text(f"# a comment\n{header}\n0,0,3,1\n")
    with pytest.raises(TraceError, match=rf"^{path}:2: column '\w+' repeats"):
        load_availability(path, 4)


def test_a_capacity_trace_with_a_repeated_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("worker,s_per_sample,up_mbps,down_mbps,up_mbps\n0,0.1,1,2,3\n")
    with pytest.raises(TraceError, match=rf"^{path}:1: column 'up_mbps' repeats"):
        load_capacity(path)


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    """Spreadsheets save "CSV UTF-8" with a BOM; it was refused as the unknown column
    '\\ufeffworker', a name that prints like the right one."""
    path = tmp_path / "a.csv"
    path.write_bytes(b"\xef\xbb\xbfworker,online_from_s,online_to_s\r\n1,0,3\r\n")
    assert [t.intervals for t in load_availability(path, 2)] == [(), ((0.0, 3.0),)]
