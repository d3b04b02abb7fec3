"""SCAFFOLD's server control variate is the mean of every live worker's latest ``c_i``
(the paper's ``c = (1/N) sum_i c_i``), also when a round closes without some members
(backup workers, deadlines): the straggler's ``c_i`` stays in the mean, and its late
``c_i+`` replaces the previous one. It used to become the mean of the round's arrivals
only, so a straggler dropped every round never entered ``c``. Expected values are the
means of the pushed vectors, computed here."""

from __future__ import annotations

import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD, Push
from asyncsync.protocols.scaffold import ScaffoldParams, ScaffoldServer


def _rule(workers: int, backup: int) -> ScaffoldServer:
    store = ParameterStore(torch.zeros(3), workers, FlatSGD(0.1))
    store.live.update(range(workers))
    return ScaffoldServer(ScaffoldParams(backup_workers=backup), store)


def _push(worker: int, version: int, kind: str, value: float) -> Push:
    return Push(worker, version, kind, torch.full((3,), value), 8, 128)


async def test_a_round_closed_without_a_straggler_keeps_its_control_variate() -> None:
    rule = _rule(3, backup=1)
    # round 0: all three push c_i+ (0, 3, 9); the first two deltas close it
    for worker, value in [(0, 0.0), (1, 3.0), (2, 9.0)]:
        await rule.on_push(_push(worker, 0, "control", value))
    for worker in (0, 1):
        await rule.on_push(_push(worker, 0, "delta", 1.0))
    assert rule.store.version == 1
    assert torch.allclose(rule.control, torch.full((3,), (0.0 + 3.0 + 9.0) / 3))
    late = await rule.on_push(_push(2, 0, "delta", 1.0))
    assert late.get("late") is True  # its delta is dropped...
    # round 1: 0 and 1 push again (6, 12); 2's control of round 0 arrives late (15)
    for worker, value in [(0, 6.0), (1, 12.0)]:
        await rule.on_push(_push(worker, 1, "control", value))
    await rule.on_push(_push(2, 0, "control", 15.0))  # (a straggler one round behind)
    for worker in (0, 1):
        await rule.on_push(_push(worker, 1, "delta", 1.0))
    assert rule.store.version == 2
    assert torch.allclose(rule.control, torch.full((3,), (6.0 + 12.0 + 15.0) / 3))


async def test_a_lost_straggler_leaves_the_mean() -> None:
    rule = _rule(3, backup=1)
    for worker, value in [(0, 0.0), (1, 3.0), (2, 9.0)]:
        await rule.on_push(_push(worker, 0, "control", value))
    for worker in (0, 1):
        await rule.on_push(_push(worker, 0, "delta", 1.0))
    store = rule.store
    assert isinstance(store, ParameterStore)
    store.live.discard(2)
    await rule.on_leave(2)
    for worker, value in [(0, 6.0), (1, 12.0)]:
        await rule.on_push(_push(worker, 1, "control", value))
    await rule.on_push(_push(0, 1, "delta", 1.0))  # with 2 live and b = 1: closes the round
    assert rule.store.version == 2
    # 1's delta is late, its c_i+ counts; 2's (9) left with it
    assert torch.allclose(rule.control, torch.full((3,), (6.0 + 12.0) / 2))
