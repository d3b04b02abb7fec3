"""The adaptive deadline follows the durations of the rounds in its window only: a very
late report of a round that has left the window, or a round whose only report was
withdrawn (its worker rejoined, to report anew), does not bend it. Expected deadlines are
the quantiles of hand-made durations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.bsp import BspParams, BspServer
from asyncsync.protocols.deadlines import quantile
from tests.test_protocol_backup_workers import bsp_rule, gradient, in_virtual_time


async def push_at(rule: BspServer, store: ParameterStore, t: float, worker: int,
                  version: int) -> dict[str, Any]:
    """Worker `worker`'s gradient based on `version`, pushed at run time `t`."""
    await asyncio.sleep(t - store.now())
    return await rule.on_push(gradient(worker, version, torch.ones(4)))


def test_a_late_report_of_a_round_out_of_the_window_is_no_round_of_duration_zero() -> None:
    """Window 3, quantile 0.25. Rounds 0..3 last 4, 1, 2 and 1 s; the window then holds
    1, 2, 1 and round 4's deadline is quantile([1, 1, 2], 0.25) = 1. Worker 3's report of
    round 0 arrives after round 3: it came back as a round of duration 0 that pushed
    round 1 out (deadline quantile([0, 1, 2], 0.25) = 0.5)."""
    params = BspParams(backup_workers=1, deadline_quantile=0.25, deadline_window=3)

    async def main() -> float | None:
        rule, store = bsp_rule(4, params, torch.zeros(4))
        t = 0.0
        for version, duration in enumerate([4.0, 1.0, 2.0, 1.0]):
            for worker, offset in enumerate([0.0, duration / 2, duration]):
                await push_at(rule, store, t + offset, worker, version)
            assert store.version == version + 1  # closed by its third report
            t += duration + 1.0
        assert (await push_at(rule, store, t, 3, 0))["late"] is True
        await push_at(rule, store, t + 1.0, 0, 4)  # round 4: only worker 0 reports
        await asyncio.sleep(10.0)
        assert store.version == 5 and rule.rounds[-1].steps.keys() == {0}
        return rule.rounds[-1].deadline_s

    assert in_virtual_time(main) == pytest.approx(quantile([1.0, 2.0, 1.0], 0.25))


def test_a_round_whose_only_report_was_withdrawn_restarts_its_duration() -> None:
    """Window 3, quantile 0.25; rounds 0..2 last 1, 2, 3 s. Round 3's first report is
    withdrawn (its worker leaves and rejoins) and worker 1 reports 0.5 s later: the deadline is
    quantile([1, 2, 3], 0.25) = 1.5 from that report (the withdrawn report had opened
    round 3 as a duration of 0, which pushed round 0 out: 1.0). Worker 2's late report
    0.5 s after the close makes round 3 last 2 s from worker 1's report (not 2.5 s from the
    withdrawn one), so round 4's deadline is quantile([2, 3, 2], 0.25) = 2."""
    params = BspParams(deadline_quantile=0.25, deadline_window=3)

    async def main() -> tuple[list[float | None], float]:
        rule, store = bsp_rule(3, params, torch.zeros(4))
        t = 0.0
        for version, duration in enumerate([1.0, 2.0, 3.0]):
            for worker, offset in enumerate([0.0, duration / 2, duration]):
                await push_at(rule, store, t + offset, worker, version)
            t += duration + 1.0
        await push_at(rule, store, t, 0, 3)
        await asyncio.sleep(0.1)
        store.live.discard(0)
        await rule.on_leave(0)  # (its report, which arrived, still counts)
        store.live.add(0)
        await rule.on_join(0)  # back: its report is withdrawn, it will report anew
        await push_at(rule, store, t + 0.5, 1, 3)
        while store.version == 3:
            await asyncio.sleep(0.01)
        closed_at = store.now() - (t + 0.5)
        assert (await push_at(rule, store, t + 2.5, 2, 3))["late"] is True
        await push_at(rule, store, t + 5.0, 1, 4)
        await asyncio.sleep(10.0)
        assert store.version == 5
        return [r.deadline_s for r in list(rule.rounds)[-2:]], closed_at

    deadlines, closed_after = in_virtual_time(main)
    assert deadlines == pytest.approx([quantile([1.0, 2.0, 3.0], 0.25),
                                       quantile([2.0, 3.0, 2.0], 0.25)])
    assert closed_after == pytest.approx(1.5, abs=0.02)


def test_a_deadline_that_fired_for_a_withdrawn_report_does_not_close_the_next_attempt(
        ) -> None:
    """Worker 0 reports at 0 (deadline 0.5 s), leaves at 0.3 and rejoins at 0.45, while
    the store's lock is busy until 0.6, which withdraws its report; worker 1 reports at
    0.46. The timer fires at 0.5 and its close waits for the lock behind the rejoin and
    the report. Worker 1's report is the round's
    new first one: its round closes 0.5 s after it, at 1.1 (the stale close took it at
    0.6)."""
    params = BspParams(deadline_s=0.5)

    async def main() -> float:
        rule, store = bsp_rule(3, params, torch.zeros(4))
        await rule.on_push(gradient(0, 0, torch.ones(4)))
        await asyncio.sleep(0.3)
        store.live.discard(0)
        await rule.on_leave(0)
        await asyncio.sleep(0.1)
        await store.lock.acquire()  # the store is busy from 0.4 to 0.6
        await asyncio.sleep(0.05)
        store.live.add(0)
        rejoin = asyncio.create_task(rule.on_join(0))
        await asyncio.sleep(0.01)
        push = asyncio.create_task(rule.on_push(gradient(1, 0, torch.ones(4))))
        await asyncio.sleep(0.14)
        store.lock.release()
        await asyncio.gather(rejoin, push)
        while store.version == 0:
            await asyncio.sleep(0.001)
        return store.now()

    assert in_virtual_time(main) == pytest.approx(0.6 + 0.5, abs=0.002)
