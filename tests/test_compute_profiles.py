"""Compute profiles: factors over time, paced mode and overruns, recipe tables."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncsync.hetero.compute import (
    MovingStraggler,
    Paced,
    PeriodicStraggler,
    RandomSlowdown,
    StaticSlowdown,
    StepDelay,
    TraceSlowdown,
    build_profile,
)
from asyncsync.recipe import ComputeSpec
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.trainer import Trainer
from tests.helpers import batches_of, tiny_data, tiny_model


def test_static_and_step_delay() -> None:
    assert StaticSlowdown(3.0).padding(0.1) == pytest.approx(0.2)
    assert StepDelay(0.5).padding(0.01) == 0.5
    with pytest.raises(ValueError, match="factor"):
        StaticSlowdown(0.5)


def test_random_factors_are_seeded_and_held_for_a_period() -> None:
    a = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=2)
    b = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=2)
    draws = [a.factor_at(t) for t in (0.0, 5.0, 9.9, 10.0, 25.0)]
    assert draws == [b.factor_at(t) for t in (0.0, 5.0, 9.9, 10.0, 25.0)]
    assert draws[0] == draws[1] == draws[2]  # held within a period
    assert draws[2] != draws[3]  # re-drawn at the next
    assert all(1.0 <= d <= 4.0 for d in draws)
    other = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=3)
    assert other.factor_at(0.0) != draws[0]


def test_periodic_straggler_only_slows_its_worker_in_its_window() -> None:
    slow = PeriodicStraggler(worker=1, slow=5.0, duration_s=2.0, period_s=10.0, rank=1)
    other = PeriodicStraggler(worker=1, slow=5.0, duration_s=2.0, period_s=10.0, rank=0)
    assert [slow.factor_at(t) for t in (0.5, 1.9, 2.1, 9.0, 10.5)] == [5, 5, 1, 1, 5]
    assert all(other.factor_at(t) == 1.0 for t in (0.5, 10.5))


def test_moving_straggler_visits_every_worker_in_turn() -> None:
    profiles = [MovingStraggler(3.0, dwell_s=1.0, workers=3, rank=r) for r in range(3)]
    for t, straggler in ((0.5, 0), (1.5, 1), (2.5, 2), (3.5, 0)):
        assert [p.factor_at(t) for p in profiles] == [3.0 if r == straggler else 1.0
                                                      for r in range(3)]


def test_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,worker,factor\n0,1,2\n5,1,4\n3,0,1.5\n")
    profile = TraceSlowdown(trace, rank=1)
    assert [profile.factor_at(t) for t in (0.0, 4.9, 5.0, 100.0)] == [2.0, 2.0, 4.0, 4.0]
    assert TraceSlowdown(trace, rank=0).factor_at(1.0) == 1.0
    assert TraceSlowdown(trace, rank=0).factor_at(3.0) == 1.5
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1,0.5\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1"):
        TraceSlowdown(bad, rank=0)


def test_paced_steps_last_base_times_factor_and_count_overruns() -> None:
    x, y = tiny_data()
    paced = Paced(StaticSlowdown(2.0), base_step_s=0.03)
    trainer = Trainer(tiny_model(), batches_of(x, y, 0), slowdown=paced, device="cpu")
    for _ in range(5):
        began = time.perf_counter()
        result = trainer.local_step(8)
        assert 0.059 <= time.perf_counter() - began < 0.12
        assert result.compute_s == pytest.approx(0.06, abs=0.01)
    assert paced.overruns == 0
    tight = Paced(StaticSlowdown(1.0), base_step_s=1e-6)
    Trainer(tiny_model(), batches_of(x, y, 0), slowdown=tight, device="cpu").local_step(8)
    assert tight.overruns == 1


def test_trainer_reports_the_effective_factor() -> None:
    x, y = tiny_data()
    trainer = Trainer(tiny_model(), batches_of(x, y, 0), slowdown=StepDelay(0.02),
                      device="cpu")
    trainer.local_step(8)
    assert trainer.last_factor > 2.0  # a ~1 ms step padded by 20 ms


def test_recipe_profile_tables(tmp_path: Path) -> None:
    odd = ComputeSpec(profile={"name": "step_delay", "seconds": 0.5, "ranks": "odd"})
    assert [odd.build(r, 4, 0).padding(0.0) for r in range(4)] == [0.0, 0.5, 0.0, 0.5]
    scaled = ComputeSpec(slowdown=[2.0], profile={"name": "periodic", "worker": 0,
                                                   "factor": 3.0})
    assert scaled.build(0, 2, 0).factor() == 6.0
    paced = ComputeSpec(base_step_s=0.1).build(0, 1, 0)
    assert isinstance(paced, Paced)
    for table, message in (
        ({"name": "periodic", "worker": -1}, "worker: must be >= 0"),
        ({"name": "zigzag"}, "profile.name: must be one of"),
        ({"name": "random", "low": 3.0, "high": 2.0}, "high: must be >= low"),
        ({"name": "trace", "path": str(tmp_path / "none.csv")}, "cannot read trace"),
        ({"name": "moving", "speed": 1}, "profile.speed: unknown key"),
    ):
        with pytest.raises(ConfigError, match=message):
            from_mapping(ComputeSpec, {"profile": table}, "defaults.compute")


def test_built_profiles_start_with_the_run() -> None:
    profile = build_profile({"name": "moving", "factor": 2.0, "dwell_s": 0.05}, 1.0, 0.0,
                            rank=1, workers=2, seed=0)
    profile.start()
    assert profile.factor() == 1.0
    time.sleep(0.06)
    assert profile.factor() == 2.0
