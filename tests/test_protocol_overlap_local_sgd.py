"""Overlap Local SGD: the anchor is the mean of the pushed models; the worker pulls toward
the one-round-old anchor while the next averaging is in flight; overlap hides a slow link."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.hetero.network import LinkSpec
from asyncsync.protocols.base import OutOfStep, Pull, Push, Refused, RunStopped
from asyncsync.protocols.overlap_local_sgd import (
    OverlapLocalSgdParams,
    OverlapLocalSgdServer,
    OverlapLocalSgdWorker,
)
from tests.helpers import run_http, run_local
from tests.test_protocol_diloco import FakeContext, make_store

# One model push is ~1.4 kB (tensor, header and stats): 110 ms at 0.1 Mbit/s, about four
# 30 ms local steps; a push and a pull take about seven.
SLOW_LINK = LinkSpec(uplink_mbps=0.1, downlink_mbps=0.1)
STEP_S = 0.03


async def test_server_anchor_is_the_mean_of_the_round_models() -> None:
    store = make_store(torch.zeros(4), 3)
    rule = OverlapLocalSgdServer(OverlapLocalSgdParams(), store)
    models = [torch.tensor([1.0, 2.0, 3.0, 4.0]) * (i + 1) for i in range(3)]
    early = asyncio.create_task(rule.on_pull(Pull(2, 0)))  # waits for its push's round
    await rule.on_push(Push(0, 0, "model", models[0], 8, 128))
    with pytest.raises(Refused) as twice:
        await rule.on_push(Push(0, 0, "model", models[0], 8, 128))
    assert isinstance(twice.value, OutOfStep)
    await rule.on_push(Push(1, 0, "model", models[1], 8, 128))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0)))
    await asyncio.sleep(0.02)
    assert not waiting.done() and not early.done() and store.version == 0
    await rule.on_push(Push(2, 0, "model", models[2], 8, 128))
    for reply in (await waiting, await asyncio.wait_for(early, 1)):
        assert reply.version == 1 and reply.vector is not None
        assert torch.equal(reply.vector, torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert torch.equal(store.w, torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert sorted(store.commits[0].contributions) == [(0, 0), (1, 0), (2, 0)]
    assert rule.tensor_numel("push", {}) == 4 and rule.tensor_numel("pull", {}) is None


async def test_worker_pulls_toward_the_previous_anchor_while_averaging_in_background() -> None:
    tau, alpha = 3, 0.2

    def anchor(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((5,), 100.0 * (number + 1))

    # each pull is answered only after two more local steps: a loop that waited for it
    # before stepping on would never finish (wait_for fails the test)
    ctx = FakeContext(5, max_steps=13, reply=anchor, lag=2)
    params = OverlapLocalSgdParams(local_steps=tau, alpha=alpha)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(OverlapLocalSgdWorker(params).run(ctx.as_context()), 5)

    # by hand: every step adds 1; z starts at the initial model (0) and is one round old
    x, z, expected = 0.0, 0.0, []
    for number in range(5):
        x += tau
        if number > 0:
            z = 100.0 * number
        x = (1 - alpha) * x + alpha * z
        expected.append(x)
    assert torch.allclose(ctx.local, torch.full((5,), expected.pop()))  # the fifth mix
    assert len(ctx.sent) == 4
    for sent, value in zip(ctx.sent, expected, strict=True):
        assert torch.allclose(sent.vector, torch.full((5,), value)), (sent.vector, value)
        assert sent.kind == "model" and sent.steps == tau and sent.samples == 16 * tau
    assert [s.step for s in ctx.sent] == [3, 6, 9, 12]
    assert [s.base_version for s in ctx.sent] == [0, 1, 2, 3]
    # every averaging was answered while local steps went on, before its result was used
    assert [(a.asked, a.answered) for a in ctx.answers] == [(3, 5), (6, 8), (9, 11), (12, 14)]
    # after every block of tau steps the whole model is pulled toward the anchor averaged
    # from the models pushed one block earlier (at step 3: the starting model)
    assert [(m.step, m.start, m.stop, m.weight) for m in ctx.mixes] == [
        (step, 0, 5, alpha) for step in (3, 6, 9, 12, 15)]
    assert [m.target.tolist() for m in ctx.mixes] == [
        [value] * 5 for value in (0.0, 100.0, 200.0, 300.0, 400.0)]
    assert not ctx.adopted  # the local model is only ever pulled toward the anchor
    # the fifth averaging, started when the step budget ran out, was cancelled, not leaked
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_failed_background_exchange_ends_the_loop_at_the_next_sync_point() -> None:
    ctx = FakeContext(3, max_steps=100, reply=lambda n, meta: torch.zeros(3), fail_push=2)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(
            OverlapLocalSgdWorker(OverlapLocalSgdParams(local_steps=4)).run(ctx.as_context()), 5)
    assert [s.step for s in ctx.sent] == [4, 8]
    assert ctx.done == 12  # the block in flight finished; nothing was sent after the failure
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_overlap_hides_a_slow_link_that_stalls_bsp() -> None:
    core, finals = await run_local("overlap_local_sgd", [STEP_S, STEP_S], time_s=2.0,
                                   link=SLOW_LINK)
    _, bsp = await run_local("bsp", [STEP_S, STEP_S], time_s=2.0, link=SLOW_LINK)
    overlap = [f["compute_s"] / f["wall_s"] for f in finals]
    baseline = [f["compute_s"] / f["wall_s"] for f in bsp]
    assert min(overlap) > 0.9, overlap
    assert max(baseline) < 0.6, baseline
    assert core.store.version >= 3
    # the transfers were long and ran concurrently with the steps
    for f in finals:
        assert f["push_s"] + f["pull_s"] > 0.3 * f["wall_s"], f
        assert f["compute_s"] + f["push_s"] + f["pull_s"] > 1.2 * f["wall_s"], f


async def test_overlap_local_sgd_over_http() -> None:
    core, finals = await run_http("overlap_local_sgd", workers=3, time_s=1.0)
    assert core.store.version >= 3
    assert all(f["steps"] >= 24 and f["bytes_up"] > 0 for f in finals)
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert core.evals[-1].loss < core.evals[0].loss


@pytest.mark.parametrize(("field_name", "value"), [
    ("local_steps", 0), ("alpha", 0.0), ("alpha", 1.5)])
def test_bad_parameters_name_the_parameter(field_name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field_name):
        OverlapLocalSgdParams(**{field_name: value})
