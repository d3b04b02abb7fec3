"""What a worker does when its rule refuses a request, as writing-a-protocol.md says:
`Unacceptable` re-syncs it and it goes on; `OutOfStep` rejoins it; `BadRequest` ends it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import (
    BadRequest,
    NoParams,
    OutOfStep,
    Protocol,
    Push,
    Refused,
    ServerRule,
    Unacceptable,
    WorkerLoop,
)
from asyncsync.protocols.ports import Context
from asyncsync.study.simulation import run_virtual

REFUSAL: list[type[Refused]] = []


class RefuseSecond(ServerRule[NoParams]):
    """Applies every gradient but the second, which it refuses with `REFUSAL[0]`."""

    push_kinds = frozenset({"gradient"})
    pushes = 0

    async def on_push(self, push: Push) -> dict[str, Any]:
        RefuseSecond.pushes += 1
        if RefuseSecond.pushes == 2:
            raise REFUSAL[0]("the second push")
        async with self.store.lock:
            await self.store.apply_gradient(push.vector, [(push.worker, push.base_version)])
        return {}


class Pushing(WorkerLoop[NoParams]):
    async def run(self, ctx: Context) -> None:
        while True:
            result, gradient = await ctx.gradient()
            await ctx.push("gradient", gradient, 1, result.samples)


REFUSING = Protocol("s10_refuse_second", "refuses the second push", NoParams, RefuseSecond,
                    Pushing)


def batches(rank: int) -> Any:
    return lambda size: (torch.zeros(size, 2), torch.zeros(size, dtype=torch.long))


def run(refusal: type[Refused]) -> list[dict[str, Any]]:
    REFUSAL[:] = [refusal]
    RefuseSecond.pushes = 0
    _, finals = run_virtual(REFUSING, lambda: nn.Linear(2, 2), batches, [0.0],
                            settings=ServerSettings(time_s=5.0), max_steps=6)
    return finals


def test_unacceptable_re_syncs_and_the_worker_goes_on() -> None:
    (final,) = run(Unacceptable)
    assert final["refused"] == 1 and final["steps"] == 6


def test_out_of_step_rejoins_and_the_worker_goes_on() -> None:
    (final,) = run(OutOfStep)
    assert final["refused"] == 0 and final["steps"] == 6


def test_bad_request_ends_the_worker() -> None:
    with pytest.raises(BadRequest, match="the second push"):
        run(BadRequest)
