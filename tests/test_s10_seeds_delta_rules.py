"""The delta arithmetic of WBSP, NBSync and ESync, and WBSP's waiting set, by hand.

WBSP: ``w <- w + delta / N`` on arrival into a working model, published as a version only
on the slowest worker's push; a push's reply offers a pull exactly when a version newer
than the pusher's base exists; the slowest is the highest moving average of seconds per
step (``rate_smoothing`` on the newest gap). NBSync's async server mode: ``w += delta / n``
on arrival, n the live workers then, one version per delta. ESync (and NBSync's sync mode):
``w <- w + mean_i delta_i`` once per round.
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.protocols.base import Push
from asyncsync.protocols.esync import EsyncParams, EsyncServer
from asyncsync.protocols.nbsync import NbsyncParams, NbsyncServer
from asyncsync.protocols.testing import FakeStore
from asyncsync.protocols.wbsp import WbspParams, WbspServer


def delta(value: float) -> torch.Tensor:
    return torch.full((4,), value)


async def test_wbsp_publishes_the_working_sum_on_the_slow_workers_push() -> None:
    store = FakeStore(torch.zeros(4), 3)
    rule = WbspServer(WbspParams(slow_worker=2), store)
    replies = []
    for worker, value in [(0, 3.0), (0, 6.0), (1, 9.0)]:  # fast pushes: no version yet
        replies.append(await rule.on_push(Push(worker, 0, "delta", delta(value), 1, 16)))
    assert store.version == 0 and torch.equal(store.w, torch.zeros(4))
    assert replies == [{"pull": False}] * 3  # nothing newer than version 0 to pull
    await rule.on_push(Push(2, 0, "delta", delta(12.0), 1, 16))
    assert store.version == 1
    # (3 + 6 + 9 + 12) / 3, every delta counted once with weight 1/N
    assert torch.allclose(store.w, delta(10.0))
    assert store.commits[0].contributions == [(0, 0), (0, 0), (1, 0), (2, 0)]
    # worker 0, still on version 0, is told to pull; after adopting version 1 it is not
    assert await rule.on_push(Push(0, 0, "delta", delta(3.0), 1, 16)) == {"pull": True}
    assert await rule.on_push(Push(0, 1, "delta", delta(3.0), 1, 16)) == {"pull": False}
    assert store.version == 1  # fast pushes went to the working model only
    await rule.on_push(Push(2, 1, "delta", delta(0.0), 1, 16))
    assert torch.allclose(store.w, delta(10.0 + 2.0))
    assert [p.published for p in rule.pushes] == [False, False, False, True, False, False,
                                                  True]


@pytest.mark.parametrize(("smoothing", "published"), [(0.5, False), (1.0, True)])
async def test_wbsp_slowest_is_the_highest_moving_average_of_step_time(
        smoothing: float, published: bool) -> None:
    """Worker 1 steps every 3 s; worker 0 every 1 s, then one 4 s gap. With smoothing 0.5
    worker 0's estimate is 0.5 * 1 + 0.5 * 4 = 2.5 s < 3 s: not the slowest. With
    smoothing 1 (newest gap only) it is 4 s > 3 s: the slowest, so its push publishes."""
    store = FakeStore(torch.zeros(4), 2)
    rule = WbspServer(WbspParams(rate_smoothing=smoothing), store)

    async def push(worker: int, at: float) -> bool:
        store.clock = at
        await rule.on_push(Push(worker, store.version, "delta", delta(1.0), 1, 16))
        return rule.pushes[-1].published

    for worker, at in [(0, 0.0), (1, 0.0), (0, 1.0), (1, 3.0), (0, 2.0)]:
        await push(worker, at)  # estimates: worker 0 at 1 s per step, worker 1 at 3 s
    assert not await push(0, 3.0)  # 1 s < 3 s
    assert await push(1, 6.0)  # 3 s: the slowest
    assert await push(0, 7.0) is published


async def test_nbsync_async_mode_adds_each_delta_over_the_live_workers() -> None:
    store = FakeStore(torch.zeros(4), 3)
    rule = NbsyncServer(NbsyncParams(server_mode="async"), store)
    await rule.on_push(Push(0, 0, "delta", delta(3.0), 2, 32))
    assert store.version == 1 and torch.allclose(store.w, delta(1.0))  # 3 / 3
    await store.leave(rule, 2)
    await rule.on_push(Push(1, 0, "delta", delta(4.0), 5, 80))
    assert store.version == 2 and torch.allclose(store.w, delta(1.0 + 2.0))  # 4 / 2 live
    assert [c.contributions for c in store.commits] == [[(0, 0)], [(1, 0)]]


async def test_nbsync_sync_mode_adds_the_mean_delta_once_per_round() -> None:
    store = FakeStore(torch.full((4,), 1.0), 2)
    rule = NbsyncServer(NbsyncParams(), store)
    await rule.on_push(Push(0, 0, "delta", delta(2.0), 4, 64))
    assert store.version == 0  # waits for the other worker's delta of this round
    await rule.on_push(Push(1, 0, "delta", delta(6.0), 1, 16))
    assert store.version == 1 and torch.allclose(store.w, delta(1.0 + (2.0 + 6.0) / 2))


async def test_esync_round_adds_the_mean_delta_with_global_rate_one() -> None:
    store = FakeStore(torch.full((4,), 2.0), 3)
    rule = EsyncServer(EsyncParams(), store)
    for worker, value in enumerate([1.0, 2.0, 6.0]):  # 9 local steps, 2, 1: any counts
        await rule.on_push(Push(worker, 0, "delta", delta(value), [9, 2, 1][worker], 16))
    assert store.version == 1 and torch.allclose(store.w, delta(2.0 + 3.0))
    assert [r.steps for r in rule.history] == [{0: 9, 1: 2, 2: 1}]
