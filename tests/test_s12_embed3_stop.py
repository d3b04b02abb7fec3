"""A worker loop whose own ``except Exception`` swallows `RunStopped` ends its worker with
`LoopWentOn` (a `BaseException`, as `asyncio.CancelledError` is) instead of training on and
asking a stopped server forever (docs/embedding.md, docs/writing-a-protocol.md)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch import nn

from asyncsync import LocalTransport, Worker, build_core, get_protocol
from asyncsync.engine.presence import STOP_GRACE
from asyncsync.engine.settings import ServerSettings
from asyncsync.errors import LoopWentOn
from asyncsync.protocols.base import Context, Protocol, WorkerLoop

ASP = get_protocol("asp")
SWALLOWED: list[str] = []


class CarelessLoop(WorkerLoop):
    """asp's loop inside a broad ``except Exception``, as a user might write it."""

    async def run(self, ctx: Context) -> None:
        while True:
            try:
                vector, version, _ = await ctx.pull()
                await ctx.adopt(vector, version)
                result, grad = await ctx.gradient()
                await ctx.push("gradient", grad, steps=1, samples=result.samples)
            except Exception as exc:  # the mistake under test
                SWALLOWED.append(type(exc).__name__)


CARELESS = Protocol("careless_asp", "asp inside a broad except", ASP.params, ASP.server,
                    CarelessLoop)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, 4)
    return x, (x[:, 0] > 0).long()


@pytest.mark.parametrize("stop", ["server", "budget"])
async def test_a_loop_that_swallows_the_stop_ends_with_loop_went_on(stop: str) -> None:
    SWALLOWED.clear()
    core = build_core(model(), CARELESS, 1, ServerSettings(time_s=None if stop == "budget"
                                                           else 0.5))
    worker = Worker(0, LocalTransport(core), model(), batch, CARELESS, heartbeat_s=None,
                    max_steps=5 if stop == "budget" else None)
    try:
        with pytest.raises(LoopWentOn, match="after"):
            await asyncio.wait_for(worker.run(), 20)  # before the fix: the wait times out
    finally:
        await core.stop()
        await core.close()
    # the stop and the repeats the grace allows, then the worker ended
    assert SWALLOWED == ["RunStopped"] * STOP_GRACE
    assert core.status()["workers"][0]["state"] == "left"  # its leave still went out
