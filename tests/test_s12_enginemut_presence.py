"""A worker's stop latch and presence, checked piece by piece (found by mutation testing)."""

from __future__ import annotations

import asyncio
import math

import pytest

from asyncsync.engine.presence import STOP_GRACE, Presence, StopLatch, WentOffline
from asyncsync.errors import LoopWentOn
from asyncsync.hetero.availability import OnlineTimes
from asyncsync.protocols.base import NotInRun, OutOfStep, RunStopped
from asyncsync.runlog.metrics import JsonlLog, WorkerMetrics


def test_once_stopped_every_later_request_but_leave_is_stopped_without_the_server() -> None:
    latch = StopLatch(3)
    latch.check("push")  # the run goes on: nothing raised
    with pytest.raises(RunStopped):
        latch.stop("pull")  # the server's stop: told once
    for what in ("push", "pull", "query"):  # each later request is told again, locally
        with pytest.raises(RunStopped):
            latch.check(what)
    latch.check("leave")  # a leave still goes out
    assert latch.after == 4  # the stop, then push, pull and query; the leave not counted


def test_the_stop_is_told_grace_times_then_the_loop_is_ended() -> None:
    latch = StopLatch(5)
    for _ in range(STOP_GRACE):
        with pytest.raises(RunStopped):
            latch.stop("push")
    with pytest.raises(LoopWentOn, match="worker 5"):
        latch.check("push")


def run_sessions(times: OnlineTimes) -> tuple[dict[str, bool], list[str]]:
    """The first join's fields, then what two sessions of a worker with `times` did."""
    presence = Presence(times, WorkerMetrics(JsonlLog(None)))
    fields = presence.join_fields()
    done: list[str] = []

    async def run() -> None:
        done.append("ran")

    async def two() -> None:
        for _ in range(2):
            try:
                await presence.session(run)
            except WentOffline:
                done.append("offline")

    asyncio.run(two())
    return fields, done


def test_a_worker_offline_at_the_start_joins_away_then_runs_its_next_session() -> None:
    # offline from 0 to 6: its first join is away, its first session ends at once, and
    # the session after its rejoin runs
    assert run_sessions(OnlineTimes(((6.0, math.inf),))) == ({"away": True},
                                                              ["offline", "ran"])


def test_a_worker_online_at_the_start_joins_as_any_and_runs_every_session() -> None:
    assert run_sessions(OnlineTimes(((0.0, 6.0),))) == ({}, ["ran", "ran"])


class FakeClock:
    """A run's clock that a sleep moves on by what it was asked plus `overshoot` (a loaded
    machine wakes late)."""

    def __init__(self, t: float, overshoot: float = 0.0) -> None:
        self.t = t
        self.overshoot = overshoot
        self.slept: list[float] = []

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.t += max(delay, 0.0) + self.overshoot


def presence_on(clock: FakeClock, times: OnlineTimes,
                monkeypatch: pytest.MonkeyPatch) -> Presence:
    metrics = WorkerMetrics(JsonlLog(None))
    monkeypatch.setattr(metrics, "now", lambda: clock.t)
    monkeypatch.setattr("asyncsync.engine.presence.sleep", clock.sleep)
    return Presence(times, metrics)


def test_the_watch_ends_at_the_edge_of_the_online_interval_not_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(2.0)
    presence = presence_on(clock, OnlineTimes(((0.0, 6.0), (8.0, math.inf))), monkeypatch)

    async def watch() -> None:
        await asyncio.gather(*presence.watch())

    asyncio.run(watch())
    assert clock.slept == [pytest.approx(4.0, abs=1e-9)]  # from 2 to the edge at 6


@pytest.mark.parametrize("refusal", [OutOfStep("already out"), NotInRun("gone"), OSError()])
def test_an_absence_whose_leave_is_refused_waits_as_any(
        refusal: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(6.0)
    presence = presence_on(clock, OnlineTimes(((0.0, 6.0), (8.0, math.inf))), monkeypatch)

    async def leave() -> None:
        raise refusal

    asyncio.run(presence.absence(leave))
    assert clock.t == pytest.approx(8.0)  # back online at 8, the leave's refusal ignored


def test_an_interval_missed_by_a_late_wake_up_is_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # offline at 1; online again from 2 to 2.5, but each sleep wakes 1 s late: at 3 the
    # worker is offline again, so it waits for the interval from 5 (woken at 6)
    clock = FakeClock(1.0, overshoot=1.0)
    times = OnlineTimes(((0.0, 1.0), (2.0, 2.5), (5.0, math.inf)))
    presence = presence_on(clock, times, monkeypatch)

    async def leave() -> None:
        pass

    asyncio.run(presence.absence(leave))
    assert clock.t == pytest.approx(6.0)
    assert clock.slept == [pytest.approx(1.0), pytest.approx(2.0)]
