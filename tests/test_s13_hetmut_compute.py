"""Compute profiles against their documented rules (session 13 mutation tests).

Each test kills a plausible bug the other tests let through: a straggler window closed at
its end, a random factor that does not fill [low, high], a recipe's seed not reaching the
random profile, odd and even ranks swapped, a limit of step delays off by one, a
straggling window longer than its period, and a trace rewritten in place read stale.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from asyncsync.hetero.compute import (
    PeriodicParams,
    PeriodicStraggler,
    RandomSlowdown,
    TraceSlowdown,
    build_profile,
)


def test_a_periodic_window_is_half_open() -> None:
    """Slow for d = 2 s out of every p = 10 s: [0, 2), [10, 12), ... A step that starts
    exactly at 2 s runs at full speed, one that starts at 10 s is slow (as the moving
    straggler's and the random profile's periods, floor(t / p), start at their start)."""
    slow = PeriodicStraggler(worker=0, slow=5.0, duration_s=2.0, period_s=10.0, rank=0)
    assert [slow.factor_at(t) for t in (0.0, 2.0, 10.0, 12.0, 20.0)] == [5, 1, 5, 1, 5]


def test_a_window_as_long_as_its_period_slows_always() -> None:
    slow = PeriodicStraggler(worker=0, slow=3.0, duration_s=4.0, period_s=4.0, rank=0)
    assert [slow.factor_at(t) for t in (0.0, 3.99, 4.0, 7.5)] == [3.0] * 4
    with pytest.raises(ValueError, match="duration_s: must be <= period_s"):
        PeriodicParams(duration_s=10.5, period_s=10.0)


def test_random_factors_are_uniform_on_low_high() -> None:
    """2,000 periods of U[1, 4]: mean 2.5 (standard error 0.87 / sqrt(2000) = 0.02), a
    sixth of the draws above 3.5, a sixth below 1.5."""
    profile = RandomSlowdown(1.0, 4.0, period_s=1.0, seed=3, rank=0)
    draws = np.array([profile.factor_at(epoch + 0.5) for epoch in range(2000)])
    assert draws.mean() == pytest.approx(2.5, abs=0.1)
    assert (draws > 3.5).mean() == pytest.approx(1 / 6, abs=0.04)
    assert (draws < 1.5).mean() == pytest.approx(1 / 6, abs=0.04)


def test_a_recipes_random_profile_follows_the_run_seed() -> None:
    table = {"name": "random", "low": 1.0, "high": 4.0, "period_s": 1.0}
    runs = [[build_profile(table, 1.0, 0, 2, seed).factor_at(t) for t in range(5)]
            for seed in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_step_delays_for_odd_or_even_ranks() -> None:
    odd = {"name": "step_delay", "seconds": 0.5, "ranks": "odd"}
    even = {**odd, "ranks": "even"}
    assert [build_profile(odd, 1.0, r, 4, 0).padding(0.0, 0.1) for r in range(4)] == [
        0.0, 0.5, 0.0, 0.5]
    assert [build_profile(even, 1.0, r, 4, 0).padding(0.0, 0.1) for r in range(4)] == [
        0.5, 0.0, 0.5, 0.0]


def test_one_step_delay_per_worker_is_accepted() -> None:
    table = {"name": "step_delay", "seconds": [0.1, 0.2]}
    assert [build_profile(table, 1.0, r, 2, 0).padding(0.0, 0.0) for r in range(2)] == [
        0.1, 0.2]


def test_a_trace_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    """The parsed trace is kept by path, size and modification time: a rewrite of the same
    size (factor 2 to 3) with a new time is read afresh, as is one of another size."""
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,worker,factor\n0,0,2\n")
    os.utime(trace, ns=(1_000_000_000, 1_000_000_000))
    assert TraceSlowdown(trace, rank=0).factor_at(1.0) == 2.0
    trace.write_text("time_s,worker,factor\n0,0,3\n")
    os.utime(trace, ns=(2_000_000_000, 2_000_000_000))
    assert TraceSlowdown(trace, rank=0).factor_at(1.0) == 3.0
    trace.write_text("time_s,worker,factor\n0,0,4.5\n")
    os.utime(trace, ns=(2_000_000_000, 2_000_000_000))
    assert TraceSlowdown(trace, rank=0).factor_at(1.0) == 4.5
