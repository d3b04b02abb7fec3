"""The compute trace (``time_s, worker, factor``) is read as strictly as the availability
and capacity traces: its header is checked and read by name, every row is as wide as
it, and a worker's rows go forward in time, one per time. It read its columns by
position whatever the header said, skipped a misspelt header, took an empty file as a
trace of no slowdown, and chose between two rows of one time by their factors."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.hetero import compute
from asyncsync.hetero.compute import MAX_FACTOR, TraceSlowdown
from asyncsync.hetero.traces import TraceError

REPO = Path(__file__).resolve().parent.parent


def read(tmp_path: Path, text: str, workers: int | None = 4) -> dict[int, list]:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    compute._LAST_TRACE.clear()
    return compute.read_trace(path, workers)


def test_the_header_names_the_columns_in_any_order(tmp_path: Path) -> None:
    """``worker,time_s,factor`` was read as ``time_s,worker,factor``: worker 1's row at
    time 0 became worker 0's at time 1."""
    assert read(tmp_path, "worker,time_s,factor\n1,0,2\n") == {1: [(0.0, 2.0)]}


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("", 1, "empty trace"),
    ("time_s,worker,factor\n", 1, "no rows after the header"),
    ("# only a comment\n", 1, "empty trace"),
    ("time,worker,factor\n0,1,2\n", 1, "unknown column 'time'"),
    ("time_s,worker\n0,1\n", 1, "missing column 'factor'"),
    ("0,1,2\n5,1,3\n", 1, "no header"),
    ("time_s,worker,factor,time_s\n0,1,2,3\n", 1, "column 'time_s' repeats"),
    ("time_s,worker,factor\n0,1,2,9\n", 2, "4 fields, the header has 3"),
    ("time_s,worker,factor\n0,1\n", 2, "2 fields, the header has 3"),
    ("time_s,worker,factor\n0,1,\"2\n", 2, "not a CSV row"),
    ("time_s,worker,factor\n0,1,2\n\n5,1,3\n5,1,4\n", 5, "worker 1: time_s 5 repeats line 4"),
    ("time_s,worker,factor\n5,1,2\n0,2,2\n3,1,3\n", 4,
     "worker 1: time_s 3 comes before line 2's 5"),
    ("time_s,worker,factor\n0,1,0.5\n", 2, "factor 0.5 is below 1"),
    (f"time_s,worker,factor\n0,1,{MAX_FACTOR * 10:g}\n", 2, "factor 1e+07 is over 1e+06"),
    ("time_s,worker,factor\n-1,1,2\n", 2, "time_s -1 is negative"),
    ("time_s,worker,factor\n0,4,2\n", 2, "unknown worker 4: the run has workers 0..3"),
    ("time_s,worker,factor\n0,1_0,2\n", 2, "worker '1_0' is not an integer"),
])
def test_a_malformed_compute_trace_names_the_line_and_the_problem(
        tmp_path: Path, text: str, line: int, problem: str) -> None:
    with pytest.raises(TraceError) as caught:
        read(tmp_path, text)
    path = tmp_path / "trace.csv"
    assert caught.value.line == line
    assert str(caught.value).startswith(f"{path}:{line}: "), str(caught.value)
    assert problem in caught.value.problem, caught.value.problem


def test_rows_of_several_workers_interleave_each_in_time_order(tmp_path: Path) -> None:
    text = "time_s,worker,factor\n0,1,2\n0,0,3\n# a comment\n2.5,1,1\n1,0,1.5\n"
    assert read(tmp_path, text) == {0: [(0.0, 3.0), (1.0, 1.5)], 1: [(0.0, 2.0), (2.5, 1.0)]}


def test_a_recipe_naming_a_bad_trace_is_refused_by_key(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,factor\n0,0,2\n0,0,3\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:3: worker 0: time_s 0 "
                                         "repeats line 2"):
        compute.check_profile({"name": "trace", "path": str(path)}, 2)


def test_the_shipped_colocated_trace_reads_and_is_what_its_script_writes(
        tmp_path: Path) -> None:
    """It held worker 2 at 465.1 s twice (a phase shorter than the 0.1 s it writes): the
    reader took the larger factor, 1.54, for the next 35 s where the file's last row at
    that time says 1.00."""
    shutil.copy(REPO / "recipes/traces/make_colocated.py", tmp_path)
    subprocess.run([sys.executable, str(tmp_path / "make_colocated.py")], check=True,
                   timeout=60)
    shipped = REPO / "recipes/traces/colocated.csv"
    assert (tmp_path / "colocated.csv").read_text() == shipped.read_text()
    assert TraceSlowdown(shipped, 2, 16).factor_at(480.0) == 1.0
    assert len(compute.read_trace(shipped, 16)) == 16
