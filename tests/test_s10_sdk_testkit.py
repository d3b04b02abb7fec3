"""The SDK's test kit refuses and keeps what the engine refuses and keeps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.protocols.base import (
    BadRequest,
    OutOfStep,
    Push,
    ServerRule,
    Unacceptable,
    WorkerLoop,
)
from asyncsync.protocols.ports import Context
from asyncsync.protocols.testing import FakeContext, FakeStore, LoopWentOn


class Counting(ServerRule[Any]):
    """Accepts "delta" pushes, adds them to the model and counts them in its state."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: Any, store: Any) -> None:
        super().__init__(params, store)
        self.seen = torch.zeros(1)

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            self.seen = self.seen + 1
            new = await self.store.compute(torch.add, self.store.w, push.vector)
            self.store.commit(new, [(push.worker, push.base_version)])
        return {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.seen = state["seen"]


def kit(workers: int = 1) -> tuple[FakeStore, Counting, FakeContext]:
    store = FakeStore(torch.zeros(3), workers=workers)
    rule = Counting(None, store)
    return store, rule, FakeContext(store, rule)


@pytest.mark.parametrize(("kind", "vector", "steps", "samples", "base", "refusal", "match"), [
    ("gradient", torch.ones(3), 1, 16, None, BadRequest, "not accepted"),
    ("delta", torch.ones(4), 1, 16, None, Unacceptable, "shape"),
    ("delta", torch.tensor([1.0, float("nan"), 0.0]), 1, 16, None, Unacceptable, "non-finite"),
    ("delta", torch.ones(3), 1, 65537, None, Unacceptable, "max_batch"),
    ("delta", torch.ones(3), 1, 16, 5, OutOfStep, "ahead"),
])
async def test_a_push_the_engine_refuses_never_reaches_the_rule(
        kind: str, vector: torch.Tensor, steps: int, samples: int, base: int | None,
        refusal: type[Exception], match: str) -> None:
    store, rule, ctx = kit()
    with pytest.raises(refusal, match=match):
        await ctx.push(kind, vector, steps, samples, base_version=base)
    assert store.version == 0 and ctx.pushed == [] and float(rule.seen) == 0.0
    assert torch.equal(store.w, torch.zeros(3))


async def test_a_non_finite_result_is_refused_and_the_rule_state_put_back() -> None:
    store, rule, ctx = kit()
    await ctx.push("delta", torch.full((3,), 3e38), 1, 16)  # finite: 3e38 < float32 max
    with pytest.raises(Unacceptable, match="non-finite"):  # 6e38 overflows float32
        await ctx.push("delta", torch.full((3,), 3e38), 1, 16)
    assert store.version == 1 and torch.equal(store.w, torch.full((3,), 3e38))
    assert float(rule.seen) == 1.0  # the refused push's count was undone, as the engine does


async def test_a_gradient_without_copy_is_overwritten_by_the_next_computation() -> None:
    ctx = kit()[2]
    ctx.local = torch.full((3,), 4.0)
    _, first = await ctx.gradient(copy=False)  # the default loss |w|^2/2: gradient w = 4
    await ctx.steps(2)  # gradients 4 then 3.6 (w = 4 - 0.1 * 4): the last one is left
    assert torch.allclose(first, torch.full((3,), 3.6))
    _, kept = await ctx.gradient()  # w = 3.6 * 0.9 = 3.24
    await ctx.steps(1)
    assert torch.allclose(kept, torch.full((3,), 3.24))  # a copy keeps its values


class InPlace(Counting):
    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            self.store.w.add_(push.vector)  # the engine may be sending w to a reader
            self.store.commit(self.store.w, [(push.worker, push.base_version)])
        return {}


class PushOnce(WorkerLoop[Any]):
    async def run(self, ctx: Context) -> None:
        await ctx.push("delta", torch.ones(3), 1, 16)


async def test_a_rule_writing_into_the_global_model_fails_the_test() -> None:
    store = FakeStore(torch.zeros(3), workers=1)
    rule = InPlace(None, store)
    with pytest.raises(AssertionError, match="in place"):
        await PushOnce(None).run(FakeContext(store, rule))


class Unlocked(Counting):
    async def on_push(self, push: Push) -> dict[str, Any]:
        new = await self.store.compute(torch.add, self.store.w, push.vector)
        self.store.commit(new, [(push.worker, push.base_version)])  # lost-update race
        return {}


async def test_a_commit_outside_the_lock_fails_the_test() -> None:
    store = FakeStore(torch.zeros(3), workers=1)
    with pytest.raises(AssertionError, match=r"store\.lock"):
        await PushOnce(None).run(FakeContext(store, Unlocked(None, store)))
    assert store.version == 0


async def test_an_adopted_vector_is_copied_at_the_next_computation_as_the_engine_does() -> None:
    ctx = kit()[2]
    pulled = torch.full((3,), 2.0)
    await ctx.adopt(pulled, 0)
    pulled.add_(1.0)  # a loop must not write into it (but through compute) before then
    assert torch.equal(await ctx.snapshot(), torch.full((3,), 3.0))
    pulled.add_(1.0)  # now the local model is its own copy
    assert torch.equal(await ctx.snapshot(), torch.full((3,), 3.0))


async def test_a_push_from_before_its_worker_rejoined_is_out_of_step() -> None:
    store, rule, ctx = kit(workers=2)
    await ctx.push("delta", torch.ones(3), 1, 16)  # version 1
    await store.leave(rule, 0)
    await store.join(rule, 0)  # rejoins at version 1
    with pytest.raises(OutOfStep, match="rejoined at version 1"):
        await ctx.push("delta", torch.ones(3), 1, 16, base_version=0)
    await ctx.push("delta", torch.ones(3), 1, 16, base_version=1)
    assert store.version == 2


class TensorInMeta(Counting):
    async def on_push(self, push: Push) -> dict[str, Any]:
        await super().on_push(push)
        return {"seen": {"count": self.seen}}  # a tensor: msgpack cannot carry it


async def test_a_reply_meta_the_wire_cannot_carry_fails_the_test() -> None:
    store = FakeStore(torch.zeros(3), workers=1)
    with pytest.raises(TypeError, match=r"on_push: reply meta 'seen.count' is a Tensor"):
        await PushOnce(None).run(FakeContext(store, TensorInMeta(None, store)))


class Swallowing(WorkerLoop[Any]):
    async def run(self, ctx: Context) -> None:
        while True:
            try:
                result = await ctx.steps(4)
                await ctx.push("delta", torch.ones(3), 4, result.samples)
            except Exception:  # swallows RunStopped: in a run, its worker would never end
                continue


async def test_a_loop_that_goes_on_after_run_stopped_fails_instead_of_spinning() -> None:
    store, _, ctx = kit()
    ctx.max_steps = 8
    with pytest.raises(LoopWentOn, match="went on after RunStopped"):
        await asyncio.wait_for(Swallowing(None).run(ctx), timeout=10)
    assert store.version == 2 and ctx.done == 8
