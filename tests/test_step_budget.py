"""A worker's step budget is a bound: no call runs past it, in the engine and the test kit.

A protocol asks for several steps at once (local SGD's ``local_steps``); before, the
engine checked the budget once per call, so a worker with ``max_steps=6`` and 4-step
rounds did 8 steps, while the SDK's `FakeContext` stopped in the middle of the call.
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.protocols.base import RunStopped
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer
from asyncsync.protocols.testing import FakeContext, FakeStore
from tests.helpers import run_local


async def test_the_engine_never_steps_past_max_steps() -> None:
    _, finals = await run_local("local_sgd", [0.0, 0.0], params=LocalSgdParams(local_steps=4),
                                max_steps=6)
    assert [f["steps"] for f in finals] == [4, 4]


async def test_the_test_kit_stops_a_call_that_would_pass_the_budget_before_it_steps() -> None:
    store = FakeStore(torch.ones(3), workers=1)
    ctx = FakeContext(store, LocalSgdServer(LocalSgdParams(local_steps=4), store), max_steps=6)
    await ctx.steps(4)
    before = ctx.local.clone()
    with pytest.raises(RunStopped):
        await ctx.steps(4)
    assert ctx.done == 4 and torch.equal(ctx.local, before)
