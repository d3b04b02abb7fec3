"""The test kit ends a request held in a rule when its worker's session ends (it leaves,
even if it rejoins before the request wakes), as the engine's `ParameterStore.drop` does:
a request of a session taken over is not answered in the new session's name."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.base import NotInRun, Pull, Push
from asyncsync.protocols.bsp import BspParams, BspServer
from asyncsync.protocols.testing import FakeStore


def gradient(worker: int, value: float) -> Push:
    return Push(worker, 0, "gradient", torch.full((2,), value), 1, 16)


async def test_a_held_pull_of_a_session_taken_over_ends_with_not_in_run() -> None:
    store = FakeStore(torch.zeros(2), workers=2)
    rule = BspServer(BspParams(), store)
    await rule.on_push(gradient(0, 1.0))
    held = asyncio.create_task(rule.on_pull(Pull(0, 0, {})))  # waits for worker 1's push
    await asyncio.sleep(0)
    assert not held.done()
    await store.leave(rule, 0)  # taken over: the old session ends ...
    await store.join(rule, 0)  # ... and a new one of the same rank joins at once
    for _ in range(3):  # the waiters wake on the notify of the leave and the join
        await asyncio.sleep(0)
    assert held.done(), "the old session's pull still waits: it would be answered later"
    with pytest.raises(NotInRun, match="worker 0"):
        await held
    # the new session's round still closes with both workers: mean of 3 and 5, rate 1
    await rule.on_push(gradient(0, 3.0))
    await rule.on_push(gradient(1, 5.0))
    reply = await rule.on_pull(Pull(0, 0, {}))
    assert reply.vector is not None and torch.equal(reply.vector, torch.full((2,), -4.0))


async def test_a_held_pull_of_a_live_session_is_answered() -> None:
    store = FakeStore(torch.zeros(2), workers=2)
    rule = BspServer(BspParams(), store)
    await rule.on_push(gradient(0, 2.0))
    held = asyncio.create_task(rule.on_pull(Pull(0, 0, {})))
    await asyncio.sleep(0)
    await store.join(rule, 1)  # another rank (re)joining ends no session of worker 0
    await rule.on_push(gradient(1, 4.0))
    reply = await held
    assert reply.version == 1 and reply.vector is not None
    assert torch.equal(reply.vector, torch.full((2,), -3.0))  # 0 - 1 x mean(2, 4)
