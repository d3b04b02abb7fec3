"""The "Writing a protocol" page's example, run from the page's text itself."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.protocols.base import (
    PROTOCOLS,
    Context,
    NoParams,
    Protocol,
    Push,
    ServerRule,
    WorkerLoop,
)
from asyncsync.protocols.testing import FakeStore
from asyncsync.transport.local import LocalTransport
from tests.doc_pages import named_block
from tests.helpers import batches_of, tiny_data, tiny_model

PAGE = "docs/writing-a-protocol.md"


@pytest.fixture
def example() -> Iterator[types.ModuleType]:
    """The example block, executed as module `mix_every_k` (its protocol registered)."""
    module = types.ModuleType("mix_every_k")
    sys.modules["mix_every_k"] = module
    try:
        exec(compile(named_block("protocol-example"), PAGE, "exec"), module.__dict__)
        yield module
    finally:
        PROTOCOLS.pop("mix_every_k", None)
        del sys.modules["mix_every_k"]


async def test_the_pages_test_of_the_example_passes(example: types.ModuleType) -> None:
    exec(compile(named_block("protocol-test-example"), PAGE, "exec"), example.__dict__)
    await example.test_mix()


async def test_the_server_mixes_each_model_with_weight_a(example: types.ModuleType) -> None:
    store = FakeStore(torch.zeros(4), 1)
    rule = example.MixServer(example.MixParams(weight=0.25), store)
    await rule.on_push(Push(0, 0, "model", torch.full((4,), 8.0), 4, 64))
    assert torch.equal(store.w, torch.full((4,), 2.0))  # 0.75 * 0 + 0.25 * 8
    await rule.on_push(Push(0, 1, "model", torch.full((4,), 2.0), 4, 64))
    assert torch.equal(store.w, torch.full((4,), 2.0))  # 0.75 * 2 + 0.25 * 2
    with pytest.raises(ValueError, match="weight"):
        example.MixParams(weight=0.0)


async def test_the_example_trains_through_the_engine(example: types.ModuleType) -> None:
    protocol: Protocol = example.MIX
    params = example.MixParams(every=3, weight=0.5)
    x, y = tiny_data()
    core = build_core(tiny_model(), protocol, 2, ServerSettings(lr=0.1, time_s=30.0),
                      protocol_params=params, test_data=(x, y))
    workers = [Worker(rank, LocalTransport(core), tiny_model(), batches_of(x, y, rank),
                      protocol, protocol_params=params, lr=0.1, batch_size=16, max_steps=30)
               for rank in range(2)]
    finals = await asyncio.gather(*(w.run() for w in workers))
    await core.stop()
    await core.close()
    # each push carried k = 3 steps, one version per push, and the model learned
    assert all(f["steps"] == 30 for f in finals)
    assert core.store.version == 20
    assert core.evals[-1].accuracy > 0.7


class _Rule(ServerRule):
    push_kinds = frozenset({"gradient"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        return {}


class _KindlessRule(ServerRule):
    async def on_push(self, push: Push) -> dict[str, Any]:
        return {}


class _OneRound(WorkerLoop):
    """Forgets its ``while True``: one gradient, then it returns."""

    async def run(self, ctx: Context) -> None:
        result, gradient = await ctx.gradient()
        await ctx.push("gradient", gradient, 1, result.samples)


@pytest.mark.parametrize(("args", "message"), [
    (("", "s", NoParams, _Rule, _OneRound), "name must be a non-empty str"),
    ((5, "s", NoParams, _Rule, _OneRound), "name must be a non-empty str"),
    (("p", "s", NoParams(), _Rule, _OneRound), "params must be a class"),
    (("p", "s", NoParams, _OneRound, _Rule), "server must be a ServerRule subclass"),
    (("p", "s", NoParams, _Rule, _Rule), "worker must be a WorkerLoop subclass"),
    (("p", "s", NoParams, _KindlessRule, _OneRound), "_KindlessRule.push_kinds must be"),
])
def test_a_protocol_with_misplaced_parts_is_refused_by_name(args: tuple[Any, ...],
                                                            message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Protocol(*args)


async def test_a_worker_loop_that_returns_ends_its_worker_with_an_error() -> None:
    protocol = Protocol("one_round", "returns after one push", NoParams, _Rule, _OneRound)
    x, y = tiny_data()
    core = build_core(tiny_model(), protocol, 1, ServerSettings(time_s=30.0))
    worker = Worker(0, LocalTransport(core), tiny_model(), batches_of(x, y, 0), protocol,
                    heartbeat_s=None)
    try:  # it used to run the loop again and again, never learning of the run's end
        with pytest.raises(RuntimeError, match="one_round: its worker loop returned"):
            await asyncio.wait_for(worker.run(), 30.0)
        assert core.workers[0].left  # it left the run on its way out
    finally:
        await core.stop()
        await core.close()
