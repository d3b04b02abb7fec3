"""Compute profiles that name ranks or read traces: a setting the run would ignore, or a
trace value that is not a number a step can be stretched by, is refused by key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.hetero.compute import TraceSlowdown, build_profile, check_profile
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.study.hetero_specs import ComputeSpec


@pytest.mark.parametrize(("row", "problem"), [
    ("0,0,nan", r"trace\.csv:3: factor 'nan' is not finite"),
    ("0,0,inf", r"trace\.csv:3: factor 'inf' is not finite"),
    ("nan,0,2", r"trace\.csv:3: time_s 'nan' is not finite"),
    ("0,-1,2", r"trace\.csv:3: worker -1 is negative"),
])
def test_a_trace_refuses_non_finite_values_and_negative_ranks(tmp_path: Path, row: str,
                                                              problem: str) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(f"time_s,worker,factor\n0,1,1.5\n{row}\n")
    with pytest.raises(ConfigError, match=problem):
        from_mapping(ComputeSpec, {"profile": {"name": "trace", "path": str(trace)}},
                     "defaults.compute")


def test_a_trace_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,worker,factor\n0,1,2\n\n# slower from 5 s on\n5,1,4\n")
    profile = TraceSlowdown(trace, rank=1)
    assert [profile.factor_at(t) for t in (0.0, 4.9, 5.0)] == [2.0, 2.0, 4.0]


def test_a_periodic_straggler_past_the_last_worker_is_refused() -> None:
    table = {"name": "periodic", "worker": 4, "factor": 3.0}
    for rank in range(4):
        with pytest.raises(ValueError, match=r"profile\.worker: 4 is not a rank of this "
                                             r"run's 4 workers \(0\.\.3\)"):
            build_profile(table, 1.0, rank, 4, 0)
    with pytest.raises(ValueError, match=r"profile\.worker: 4"):
        check_profile(table, 4)
    check_profile(table, 5)  # worker 4 of 5 is the last one
    assert build_profile(table, 1.0, 4, 5, 0).factor_at(0.0) == 3.0


def test_more_step_delays_than_workers_are_refused() -> None:
    table = {"name": "step_delay", "seconds": [0.1, 0.2, 0.3]}
    with pytest.raises(ValueError, match=r"profile\.seconds: 3 entries for 2 workers"):
        build_profile(table, 1.0, 0, 2, 0)
    assert [build_profile(table, 1.0, r, 3, 0).padding(0.0, 0.01) for r in range(3)] == [
        0.1, 0.2, 0.3]


def test_a_trace_row_of_an_unknown_worker_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,worker,factor\n0,0,2\n0,3,2\n")
    table = {"name": "trace", "path": str(trace)}
    with pytest.raises(ValueError, match=r"trace\.csv:3: unknown worker 3: the run has "
                                         r"workers 0\.\.2"):
        build_profile(table, 1.0, 0, 3, 0)
    with pytest.raises(ValueError, match=r"profile\.path: .*trace\.csv:3: unknown worker 3"):
        check_profile(table, 3)
    assert build_profile(table, 1.0, 3, 4, 0).factor_at(0.0) == 2.0
