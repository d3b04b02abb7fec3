"""Mutation-found gaps in the classical rules, pinned by hand-computed values.

BSP's step is the plain mean of the round's gradients (PROTOCOLS.md: ``mean_i g_i``), not
weighted by the samples each batch held. SSP holds a pull exactly while ``c_i - min_j c_j >
s``: one clock of slack more or less is a different protocol.
"""

from __future__ import annotations

import asyncio

import torch

from asyncsync.engine.compute import InlineServerSeam
from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Pull, Push
from asyncsync.protocols.bsp import BspParams, BspServer
from asyncsync.protocols.ssp import SspParams, SspServer
from asyncsync.training.optim import FlatSGD

LR = 0.1


async def test_bsp_steps_on_the_unweighted_mean_whatever_the_batches_held() -> None:
    w0 = torch.tensor([1.0, -2.0, 0.5])
    g = [torch.tensor([3.0, 0.0, -6.0]), torch.tensor([-1.0, 4.0, 2.0])]
    store = ParameterStore(w0.clone(), 2, FlatSGD(LR), seam=InlineServerSeam())
    store.live.update(range(2))
    rule = BspServer(BspParams(), store)
    # a full batch and a short last batch of the shard: 64 and 8 samples
    await rule.on_push(Push(0, 0, "gradient", g[0].clone(), 1, 64))
    await rule.on_push(Push(1, 0, "gradient", g[1].clone(), 1, 8))
    assert store.version == 1
    # mean (1, 2, -2): w0 - 0.1 * mean
    assert torch.allclose(store.w, torch.tensor([0.9, -2.2, 0.7]))


async def test_ssp_holds_a_pull_exactly_when_the_gap_passes_s() -> None:
    """s = 1: a worker one clock ahead of the slowest starts its next iteration at once; two
    clocks ahead it is held until the slowest's gradient lands."""
    store = ParameterStore(torch.zeros(3), 2, FlatSGD(LR), seam=InlineServerSeam())
    store.live.update(range(2))
    rule = SspServer(SspParams(1), store)
    gradient = torch.ones(3)
    await rule.on_push(Push(0, 0, "gradient", gradient.clone(), 1, 16))  # clocks (1, 0)
    reply = await asyncio.wait_for(rule.on_pull(Pull(0, 1)), 5)
    assert reply.version == 1
    await rule.on_push(Push(0, 1, "gradient", gradient.clone(), 1, 16))  # clocks (2, 0)
    held = asyncio.ensure_future(rule.on_pull(Pull(0, 2)))
    await asyncio.sleep(0.05)
    assert not held.done()
    await rule.on_push(Push(1, 0, "gradient", gradient.clone(), 1, 16))  # clocks (2, 1)
    assert (await asyncio.wait_for(held, 5)).version == 3
