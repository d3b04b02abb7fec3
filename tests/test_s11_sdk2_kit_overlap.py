"""The test kit yields to the event loop at each local step, as the engine does, so a
worker loop that overlaps background exchanges with its steps can be tested with it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.base import RunStopped, get_protocol
from asyncsync.protocols.nbsync import NbsyncParams, NbsyncServer, NbsyncWorker
from asyncsync.protocols.overlap import Transfers
from asyncsync.protocols.testing import FakeContext, FakeStore


async def test_a_background_exchange_runs_while_the_loop_steps() -> None:
    store = FakeStore(torch.ones(3), workers=1)
    ctx = FakeContext(store, NbsyncServer(NbsyncParams(), store), max_steps=1)
    started: list[int] = []

    async def exchange() -> None:
        started.append(ctx.done)

    async with Transfers[None]() as transfers:
        transfers.start(0, exchange())
        await ctx.steps(1)  # the engine's step awaits its computation: the task starts
        assert started == [1] and not transfers.running(0)


async def test_nbsync_overlapped_loop_pushes_under_the_kit() -> None:
    store = FakeStore(torch.ones(3), workers=1)
    rule = NbsyncServer(NbsyncParams(), store)
    ctx = FakeContext(store, rule, max_steps=12)
    with pytest.raises(RunStopped):
        await NbsyncWorker(NbsyncParams()).run(ctx)
    # each exchange is a push then a pull; with one worker each push closes a round
    assert len(ctx.pushed) >= 2
    assert store.version == len(ctx.pushed)
    assert [c.contributions for c in store.commits] == [[(0, v)] for v in range(store.version)]
    assert sum(push.steps for push in ctx.pushed) <= 12
    assert all(push.steps >= 1 for push in ctx.pushed)


async def test_two_overlapped_workers_share_rounds_under_the_kit() -> None:
    store = FakeStore(torch.ones(3), workers=2)
    rule = NbsyncServer(NbsyncParams(), store)
    contexts = [FakeContext(store, rule, rank=rank, max_steps=10) for rank in (0, 1)]
    loops = [NbsyncWorker(NbsyncParams()).run(ctx) for ctx in contexts]
    results = await asyncio.gather(*loops, return_exceptions=True)
    assert all(isinstance(result, RunStopped) for result in results)
    # a round needs one delta from each of the two workers
    assert store.version >= 1
    assert all(sorted(w for w, _ in c.contributions) == [0, 1] for c in store.commits)


async def test_the_kits_documented_defaults_move_the_model_by_a_tenth_a_step() -> None:
    store = FakeStore(torch.full((2,), 2.0), workers=1)
    ctx = FakeContext(store, NbsyncServer(NbsyncParams(), store))
    result = await ctx.steps(3)
    # lr 0.1, gradient of |w|^2 / 2: each step multiplies by 0.9; 16 samples a step
    assert torch.allclose(ctx.local, torch.full((2,), 2.0 * 0.9 ** 3))
    assert result.samples == 48 and ctx.max_steps == 100
    assert store.clock == pytest.approx(0.003)


@pytest.mark.parametrize("name", ["nbsync", "wbsp_opt"])
async def test_every_overlap_worker_exchanges_under_the_kit(name: str) -> None:
    protocol = get_protocol(name)
    params = protocol.make_params()
    store = FakeStore(torch.ones(4), workers=2)
    rule = protocol.server(params, store)
    contexts = [FakeContext(store, rule, rank=rank, max_steps=20) for rank in (0, 1)]
    results = await asyncio.gather(*(protocol.worker(params).run(ctx) for ctx in contexts),
                                   return_exceptions=True)
    assert all(isinstance(result, RunStopped) for result in results)
    assert all(ctx.pushed for ctx in contexts) and store.version >= 1
    # every step a worker took is in a push or in the progress it had not pushed yet
    assert all(sum(push.steps for push in ctx.pushed) <= ctx.done for ctx in contexts)
