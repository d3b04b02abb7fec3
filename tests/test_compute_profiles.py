"""Compute profiles: factors and padding over run time, paced mode and overruns through the
worker's compute seam, recipe tables."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncsync.engine import compute
from asyncsync.engine.compute import ThreadedWorkerSeam, VirtualWorkerSeam
from asyncsync.hetero.compute import (
    ComputeProfile,
    FixedStepCost,
    MovingStraggler,
    PeriodicStraggler,
    RandomSlowdown,
    Scaled,
    StaticSlowdown,
    StepDelay,
    TraceSlowdown,
    build_profile,
    step_seconds,
)
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.study.assembly import build_worker
from asyncsync.study.hetero_specs import ComputeSpec
from asyncsync.study.specs import DataSpec, ModelSpec, RunSpec


def assert_pads_by_factor(profile: ComputeProfile, times: list[float]) -> None:
    """A factor profile pads a step of c seconds to factor x c, at every run time."""
    for t in times:
        for compute_s in (0.0, 0.01, 0.25):
            assert profile.padding(t, compute_s) == pytest.approx(
                (profile.factor_at(t) - 1.0) * compute_s), (t, compute_s)


def test_static_and_step_delay() -> None:
    static = StaticSlowdown(3.0)
    assert [static.factor_at(t) for t in (0.0, 1.0, 1e6)] == [3.0, 3.0, 3.0]
    assert static.padding(0.0, 0.1) == pytest.approx(0.2)
    assert static.padding(50.0, 0.1) == pytest.approx(0.2)
    assert StaticSlowdown(1.0).padding(7.0, 0.3) == 0.0
    delay = StepDelay(0.5)
    # a fixed sleep per step, whatever the step took and whenever it ran
    assert [delay.padding(t, c) for t, c in ((0.0, 0.01), (9.0, 0.0), (3.0, 2.0))] == [0.5] * 3
    assert StepDelay(0.0).padding(1.0, 0.1) == 0.0
    with pytest.raises(ValueError, match="factor"):
        StaticSlowdown(0.5)
    with pytest.raises(ValueError, match="delay"):
        StepDelay(-0.1)


@pytest.mark.parametrize("build", [
    lambda: StaticSlowdown(math.nan), lambda: StaticSlowdown(math.inf),
    lambda: StepDelay(math.nan), lambda: StepDelay(math.inf),
    lambda: RandomSlowdown(math.nan, 2.0, 1.0, 0, 0),
    lambda: RandomSlowdown(1.0, 2.0, math.nan, 0, 0),
    lambda: PeriodicStraggler(0, math.nan, 1.0, 2.0, 0),
    lambda: MovingStraggler(math.nan, 1.0, 2, 0), lambda: MovingStraggler(2.0, math.nan, 2, 0),
])
def test_a_profile_refuses_nan_and_inf(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="finite"):
        build()


def test_a_worker_refuses_a_nan_slowdown() -> None:
    from asyncsync.engine.worker import Worker
    from tests.helpers import batches_of, tiny_data, tiny_model

    x, y = tiny_data()
    with pytest.raises(ValueError, match="slowdown factor must be a finite number >= 1"):
        Worker.connect(0, "http://127.0.0.1:1", tiny_model(), batches_of(x, y, 0), "asp",
                       lr=0.1, batch_size=8, slowdown=math.nan)


def test_random_factors_are_seeded_and_held_for_a_period() -> None:
    a = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=2)
    b = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=2)
    times = [0.0, 5.0, 9.9, 10.0, 25.0]
    draws = [a.factor_at(t) for t in times]
    assert draws == [b.factor_at(t) for t in times]
    assert draws == [a.factor_at(t) for t in times]  # a pure function of t
    assert draws[0] == draws[1] == draws[2]  # held within a period
    assert draws[2] != draws[3]  # re-drawn at the next
    assert all(1.0 <= d <= 4.0 for d in draws)
    other = RandomSlowdown(1.0, 4.0, period_s=10.0, seed=7, rank=3)
    assert other.factor_at(0.0) != draws[0]
    assert RandomSlowdown(1.0, 4.0, period_s=10.0, seed=8, rank=2).factor_at(0.0) != draws[0]
    assert_pads_by_factor(a, times)
    with pytest.raises(ValueError, match="low"):
        RandomSlowdown(3.0, 2.0, period_s=1.0, seed=0, rank=0)


def test_periodic_straggler_only_slows_its_worker_in_its_window() -> None:
    slow = PeriodicStraggler(worker=1, slow=5.0, duration_s=2.0, period_s=10.0, rank=1)
    other = PeriodicStraggler(worker=1, slow=5.0, duration_s=2.0, period_s=10.0, rank=0)
    times = [0.5, 1.9, 2.1, 9.0, 10.5]
    assert [slow.factor_at(t) for t in times] == [5, 5, 1, 1, 5]
    assert all(other.factor_at(t) == 1.0 for t in times)
    assert_pads_by_factor(slow, times)
    assert slow.padding(0.5, 0.1) == pytest.approx(0.4)
    assert slow.padding(2.1, 0.1) == 0.0
    assert other.padding(0.5, 0.1) == 0.0


def test_moving_straggler_visits_every_worker_in_turn() -> None:
    profiles = [MovingStraggler(3.0, dwell_s=1.0, workers=3, rank=r) for r in range(3)]
    for t, straggler in ((0.5, 0), (1.5, 1), (2.5, 2), (3.5, 0)):
        assert [p.factor_at(t) for p in profiles] == [3.0 if r == straggler else 1.0
                                                      for r in range(3)]
        assert [p.padding(t, 0.1) for p in profiles] == pytest.approx(
            [0.2 if r == straggler else 0.0 for r in range(3)])


def test_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,worker,factor\n0,1,2\n5,1,4\n3,0,1.5\n")
    profile = TraceSlowdown(trace, rank=1)
    times = [0.0, 4.9, 5.0, 100.0]
    assert [profile.factor_at(t) for t in times] == [2.0, 2.0, 4.0, 4.0]
    assert_pads_by_factor(profile, times)
    assert profile.padding(5.0, 0.1) == pytest.approx(0.3)
    assert TraceSlowdown(trace, rank=0).factor_at(1.0) == 1.0
    assert TraceSlowdown(trace, rank=0).factor_at(3.0) == 1.5
    assert TraceSlowdown(trace, rank=2).factor_at(50.0) == 1.0  # not in the trace
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1,0.5\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1"):
        TraceSlowdown(bad, rank=0)


def test_scaled_multiplies_the_inner_factor_and_stretches_its_padding() -> None:
    periodic = Scaled(PeriodicStraggler(worker=0, slow=3.0, duration_s=1.0, period_s=2.0,
                                        rank=0), 2.0)
    assert [periodic.factor_at(t) for t in (0.5, 1.5)] == [6.0, 2.0]
    assert_pads_by_factor(periodic, [0.5, 1.5])
    # a step delay inner: the delayed step (c + delay) lasts `scale` times as long
    delayed = Scaled(StepDelay(0.5), 2.0)
    assert 0.1 + delayed.padding(0.0, 0.1) == pytest.approx(2.0 * (0.1 + 0.5))


def test_a_paced_step_lasts_its_batch_cost_times_the_factor() -> None:
    cost = FixedStepCost(base_step_s=0.05, reference_batch=8)
    assert step_seconds(StaticSlowdown(2.0), 3.0, cost, 8) == pytest.approx(0.1)
    assert step_seconds(StaticSlowdown(2.0), 3.0, cost, 0) == pytest.approx(0.1)  # reference
    assert step_seconds(StaticSlowdown(2.0), 3.0, cost, 16) == pytest.approx(0.2)
    assert step_seconds(StaticSlowdown(1.0), 0.0, cost, 4) == pytest.approx(0.025)
    # a time-varying factor: the duration follows it
    straggler = PeriodicStraggler(worker=0, slow=4.0, duration_s=1.0, period_s=2.0, rank=0)
    assert step_seconds(straggler, 0.5, cost, 8) == pytest.approx(0.2)
    assert step_seconds(straggler, 1.5, cost, 8) == pytest.approx(0.05)
    # a step delay adds its delay to the paced step
    assert step_seconds(StepDelay(0.02), 0.0, cost, 8) == pytest.approx(0.07)
    for base_step_s, reference_batch in ((0.0, 8), (0.1, 0)):
        with pytest.raises(ValueError, match="must be"):
            FixedStepCost(base_step_s, reference_batch)


class FakeClock:
    """Stands in for the seam's clock: real computation takes exactly what `work` says."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def work(self, seconds: float) -> Callable[[], str]:
        def step() -> str:
            self.t += seconds
            return "done"

        return step


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(compute, "now", fake)
    return fake


async def test_paced_steps_last_base_times_factor_and_count_overruns(clock: FakeClock) -> None:
    seam = ThreadedWorkerSeam(StaticSlowdown(2.0), cost=FixedStepCost(0.01, 8))
    try:
        seam.start()
        for real in (0.0, 0.001, 0.015):
            charged = await seam.step(clock.work(real), batch=8)
            assert charged.result == "done"
            assert charged.seconds == pytest.approx(0.02)  # padded to 0.01 x 2
        assert seam.overruns == 0
        # a computation longer than its paced duration runs unpadded: an overrun
        charged = await seam.step(clock.work(0.03), batch=8)
        assert charged.seconds == pytest.approx(0.03)
        assert charged.factor == pytest.approx(1.0)
        assert seam.overruns == 1
    finally:
        seam.close()


async def test_real_paced_step_time_scales_with_the_batch_like_virtual(
        clock: FakeClock) -> None:
    """LB-BSP measures speed as samples per second: in real paced mode a step of twice
    the recipe's batch must take twice as long, as in virtual time."""
    spec = RunSpec(name="r", workers=1, model=ModelSpec(name="mlp"),
                   data=DataSpec(batch_size=8), compute=ComputeSpec(base_step_s=0.01))
    worker = build_worker(spec, 0, "http://127.0.0.1:9", "run", None)
    try:
        worker.seam.start()
        charged = [await worker.seam.step(clock.work(0.0), batch=b) for b in (4, 8, 16)]
    finally:
        worker.seam.close()
        await worker.transport.close()
    assert [c.seconds for c in charged] == pytest.approx([0.005, 0.01, 0.02])
    virtual = VirtualWorkerSeam(StaticSlowdown(1.0), FixedStepCost(0.01, 8))
    assert [(await virtual.step(clock.work(0.0), batch=b)).seconds
            for b in (4, 8, 16)] == pytest.approx([0.005, 0.01, 0.02])


async def test_seam_pads_and_reports_the_effective_factor(clock: FakeClock) -> None:
    seam = ThreadedWorkerSeam(StepDelay(0.02))
    try:
        seam.start()
        charged = await seam.step(clock.work(0.01))
        assert charged.seconds == pytest.approx(0.03)
        # the factor in force is the padded step over the real one
        assert charged.factor == pytest.approx(3.0)
    finally:
        seam.close()
    static = ThreadedWorkerSeam(StaticSlowdown(3.0))
    try:
        static.start()
        charged = await static.step(clock.work(0.01))
        assert charged.seconds == pytest.approx(0.03)
        assert charged.factor == pytest.approx(3.0)
        assert static.overruns == 0
    finally:
        static.close()


def test_recipe_profile_tables(tmp_path: Path) -> None:
    odd = ComputeSpec(profile={"name": "step_delay", "seconds": 0.5, "ranks": "odd"})
    assert [odd.build(r, 4, 0).padding(0.0, 0.01) for r in range(4)] == [0.0, 0.5, 0.0, 0.5]
    per_rank = ComputeSpec(profile={"name": "step_delay", "seconds": [0.1, 0.2]})
    assert [per_rank.build(r, 3, 0).padding(0.0, 0.01) for r in range(3)] == [0.1, 0.2, 0.0]
    scaled = ComputeSpec(slowdown=[2.0], profile={"name": "periodic", "worker": 0,
                                                   "factor": 3.0})
    assert scaled.build(0, 2, 0).factor_at(0.0) == 6.0
    assert scaled.build(0, 2, 0).factor_at(10.0) == 2.0  # outside the straggling window
    assert scaled.build(1, 2, 0).factor_at(0.0) == 1.0
    assert ComputeSpec(slowdown=[1.0, 2.5]).build(1, 2, 0).factor_at(0.0) == 2.5
    assert ComputeSpec(base_step_s=0.1).build(0, 1, 0).padding(0.0, 0.01) == 0.0
    for table, message in (
        ({"name": "periodic", "worker": -1}, "worker: must be >= 0"),
        ({"name": "zigzag"}, "profile.name: must be one of"),
        ({"name": "random", "low": 3.0, "high": 2.0}, "high: must be >= low"),
        ({"name": "trace", "path": str(tmp_path / "none.csv")}, "none.csv: cannot read"),
        ({"name": "moving", "speed": 1}, "profile.speed: unknown key"),
    ):
        with pytest.raises(ConfigError, match=message):
            from_mapping(ComputeSpec, {"profile": table}, "defaults.compute")


class RecordingProfile(ComputeProfile):
    """Records the run time each padding was asked at."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def padding(self, t: float, compute_s: float) -> float:
        self.times.append(t)
        return 0.0


def test_built_profiles_are_functions_of_run_time() -> None:
    profile = build_profile({"name": "moving", "factor": 2.0, "dwell_s": 0.05}, 1.0,
                            rank=1, workers=2, seed=0)
    assert [profile.factor_at(t) for t in (0.0, 0.049, 0.06, 0.11, 0.16)] == [
        1.0, 1.0, 2.0, 1.0, 2.0]
    assert profile.padding(0.06, 0.1) == pytest.approx(0.1)
    assert profile.padding(0.0, 0.1) == 0.0


async def test_seam_run_time_starts_with_the_run() -> None:
    profile = RecordingProfile()
    seam = ThreadedWorkerSeam(profile)
    try:
        await asyncio.sleep(0.3)  # set-up time before the run starts does not count
        seam.start()
        await seam.step(lambda: None)
        await asyncio.sleep(0.3)
        await seam.step(lambda: None)
    finally:
        seam.close()
    first, second = profile.times
    assert 0.0 <= first < 0.3
    assert second >= first + 0.3 - 1e-3


def test_deferred_work_rides_on_the_next_hand_off_to_the_compute_thread() -> None:
    """An adoption deferred by the seam runs on the compute thread before the next job, in
    that job's hand-off (one submission, not two), and close() runs what is left."""
    seam = ThreadedWorkerSeam(StaticSlowdown(1.0))
    submitted = []
    submit = seam._pool.submit

    def counting(fn: Any, *args: Any) -> Any:
        submitted.append(fn)
        return submit(fn, *args)

    seam._pool.submit = counting  # type: ignore[method-assign]
    order: list[tuple[str, str]] = []

    def note(what: str) -> None:
        order.append((what, threading.current_thread().name))

    async def main() -> None:
        seam.defer(note, "adopt")
        seam.defer(note, "adopt again")
        await seam.math(note, "math")
        seam.defer(note, "last adopt")

    asyncio.run(main())
    assert [what for what, _ in order] == ["adopt", "adopt again", "math"]
    assert len(submitted) == 1
    assert all(thread.startswith("asyncsync-compute") for _, thread in order)
    seam.close()
    assert order[-1][0] == "last adopt" and len(submitted) == 2


async def test_a_short_step_holds_the_loop_only_when_nothing_else_is_under_way(
        clock: FakeClock) -> None:
    """A watched seam runs a step on the event loop's thread when the last step was short,
    no message is under way (including one a task started just before the step) and the
    compute thread is idle; otherwise on the compute thread, in order after its job."""
    seam = ThreadedWorkerSeam(StaticSlowdown(1.0), inline_below_s=0.01)
    under_way = [0]
    seam.watch(lambda: under_way[0] > 0)
    ran_on: list[str] = []

    def step_of(seconds: float) -> Callable[[], str]:
        work = clock.work(seconds)

        def step() -> str:
            ran_on.append(threading.current_thread().name)
            return work()

        return step

    loop_thread = threading.current_thread().name

    async def request_started_just_before() -> None:
        under_way[0] += 1  # a request begins in the task's first step
        await asyncio.sleep(0.05)
        under_way[0] -= 1

    gate = threading.Event()
    try:
        await seam.step(step_of(0.001))  # no step measured yet: the thread
        await seam.step(step_of(0.001))  # short, nothing under way: the loop
        under_way[0] = 1
        await seam.step(step_of(0.001))  # a message under way: the thread
        under_way[0] = 0
        await seam.step(step_of(0.001))
        task = asyncio.create_task(request_started_just_before())
        await seam.step(step_of(0.001))  # the task starts first, then counts
        await task
        await seam.step(step_of(0.001))
        job = asyncio.create_task(seam.math(gate.wait))  # the thread busy with a job
        await asyncio.sleep(0)
        stepping = asyncio.create_task(seam.step(step_of(0.001)))
        await asyncio.sleep(0.02)
        assert not stepping.done()  # queued behind the job, not run beside it
        gate.set()
        await job
        await stepping
        await seam.step(step_of(0.02))  # a long step (on the loop: the last was short)
        await seam.step(step_of(0.001))  # after a long one: the thread
    finally:
        gate.set()
        seam.close()
    thread = "asyncsync-compute"
    assert [name.startswith(thread) for name in ran_on] == [
        True, False, True, False, True, False, True, False, True]
    assert all(name == loop_thread for name in ran_on if not name.startswith(thread))


async def test_an_unwatched_seam_always_computes_in_its_thread(clock: FakeClock) -> None:
    seam = ThreadedWorkerSeam(StaticSlowdown(1.0))
    names: list[str] = []

    def step() -> None:
        names.append(threading.current_thread().name)

    try:
        for _ in range(3):
            await seam.step(step)
    finally:
        seam.close()
    assert all(name.startswith("asyncsync-compute") for name in names)
    with pytest.raises(ValueError, match="inline_below_s"):
        ThreadedWorkerSeam(StaticSlowdown(1.0), inline_below_s=-1.0)
