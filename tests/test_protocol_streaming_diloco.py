"""Streaming DiLoCo: per-fragment outer steps on fragment-sized messages; the staggered
schedule and the merge ``(1 - alpha) global + alpha local``; overlap hides a slow link."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import torch

from asyncsync.engine.worker import RunStopped
from asyncsync.protocols.base import Pull, Push
from asyncsync.protocols.streaming_diloco import (
    StreamingDilocoParams,
    StreamingDilocoServer,
    StreamingDilocoWorker,
)
from asyncsync.wire import WireError
from tests.helpers import run_http, run_local
from tests.test_protocol_diloco import FakeContext, make_store, outer_round
from tests.test_protocol_overlap_local_sgd import SLOW_LINK, STEP_S


async def test_server_steps_each_fragment_with_its_own_momentum() -> None:
    w0 = torch.arange(10, dtype=torch.float32)
    store = make_store(w0.clone(), 2)
    rule = StreamingDilocoServer(StreamingDilocoParams(fragments=3), store)
    assert rule.bounds == [(0, 3), (3, 6), (6, 10)]
    assert rule.tensor_numel("push", {"fragment": 2}) == 4
    assert rule.tensor_numel("push", {"fragment": 1}) == 3
    assert rule.tensor_numel("pull", {"fragment": 1}) is None
    for bad in (3, -1, True, "1"):
        with pytest.raises(WireError) as err:
            rule.tensor_numel("push", {"fragment": bad})
        assert err.value.status == 400
    with pytest.raises(WireError):
        await rule.on_push(Push(0, 0, "gradient", torch.ones(3), 5, 80, {"fragment": 7}))
    with pytest.raises(WireError) as early:
        await rule.on_pull(Pull(0, 0, {"fragment": 1}))
    assert early.value.status == 409
    assert store.version == 0 and torch.equal(store.w, w0)

    lr, mu = 0.7, 0.9
    a = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 0.0, 1.5])]
    b = [torch.tensor([0.0, 1.0, 1.0]), torch.tensor([2.0, 1.0, -1.0])]
    expected = w0.double().clone()

    replies = await outer_round(rule, a, {"fragment": 1})
    mean = (a[0] + a[1]).double() / 2
    buf1 = mean.clone()
    expected[3:6] -= lr * (mean + mu * buf1)
    for vector, version in replies:  # fragment-sized answers
        assert version == 1 and vector.shape == (3,)
        assert torch.allclose(vector.double(), expected[3:6], atol=1e-6)
    assert torch.allclose(store.w.double(), expected, atol=1e-6)
    assert torch.equal(store.w[:3], w0[:3]) and torch.equal(store.w[6:], w0[6:])

    await outer_round(rule, b, {"fragment": 0})  # fragment 0's momentum starts afresh
    mean = (b[0] + b[1]).double() / 2
    expected[0:3] -= lr * (mean + mu * mean)
    await outer_round(rule, b, {"fragment": 1})  # fragment 1's continues
    buf1 = mu * buf1 + mean
    expected[3:6] -= lr * (mean + mu * buf1)
    assert torch.allclose(store.w.double(), expected, atol=1e-6)
    assert torch.equal(store.w[6:], w0[6:])
    assert [(r.fragment, r.round, r.version) for r in rule.rounds] == [
        (1, 0, 1), (0, 0, 2), (1, 1, 3)]


def test_more_fragments_than_elements_is_refused() -> None:
    with pytest.raises(ValueError, match="fragments"):
        StreamingDilocoServer(StreamingDilocoParams(fragments=11), make_store(torch.zeros(10), 1))


async def test_worker_staggers_fragments_and_merges_tau_steps_later() -> None:
    h, tau, alpha = 4, 1, 0.25
    params = StreamingDilocoParams(inner_steps=h, fragments=2, overlap_steps=tau, alpha=alpha)

    def fresh(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((2,), 100.0 * (meta["fragment"] + 1) + number)

    # every answer needs one more local step: the worker must keep stepping meanwhile
    ctx = FakeContext(4, max_steps=15, reply=fresh, lag=tau)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(StreamingDilocoWorker(params).run(ctx.as_context()), 5)

    # by hand: fragment f (elements 2f, 2f+1) starts its exchange after steps f*2 + 4k
    # (k >= 1) and merges tau steps later; every step adds 1
    local, anchor, version = [0.0, 0.0], [0.0, 0.0], 0
    pushes: list[tuple[int, int, float, int, int]] = []
    last = [0, 0]
    answers: dict[int, tuple[int, float]] = {}
    for step in range(1, 16):
        local = [v + 1 for v in local]
        for f in (0, 1):
            since = step - 2 * f
            if since >= h and since % h == 0:
                number = len(pushes)
                pushes.append((step, f, anchor[f] - local[f], step - last[f], version))
                answers[f] = (number, 100.0 * (f + 1) + number)
                last[f] = step
            since -= tau
            if since >= h and since % h == 0:
                number, value = answers.pop(f)
                version = max(version, number + 1)
                local[f] = (1 - alpha) * value + alpha * local[f]
                anchor[f] = value
    got = [(s.step, s.meta["fragment"], s.vector, s.steps, s.base_version) for s in ctx.sent]
    assert [(p[0], p[1], p[3], p[4]) for p in pushes] == [(g[0], g[1], g[3], g[4]) for g in got]
    assert [p[0] for p in pushes] == [4, 6, 8, 10, 12, 14]
    for (_, _, value, _, _), (_, _, vector, _, _) in zip(pushes, got, strict=True):
        assert vector.shape == (2,) and torch.allclose(vector, torch.full((2,), value))
    assert all(s.kind == "gradient" for s in ctx.sent)
    assert torch.allclose(ctx.trainer.flat, torch.tensor([local[0]] * 2 + [local[1]] * 2))
    assert [(a.asked, a.answered) for a in ctx.answers] == [
        (s, s + tau) for s in (4, 6, 8, 10, 12, 14)]
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_streaming_hides_a_slow_link_that_stalls_bsp() -> None:
    # a fragment's exchange every 4 steps, each with 5 steps (150 ms) to complete
    params = StreamingDilocoParams(inner_steps=12, fragments=3)
    core, finals = await run_local("streaming_diloco", [STEP_S, STEP_S], params=params,
                                   time_s=2.0, link=SLOW_LINK)
    _, bsp = await run_local("bsp", [STEP_S, STEP_S], time_s=2.0, link=SLOW_LINK)
    streaming = [f["compute_s"] / f["wall_s"] for f in finals]
    baseline = [f["compute_s"] / f["wall_s"] for f in bsp]
    assert min(streaming) > 0.9, streaming
    assert max(baseline) < 0.6, baseline
    rule = cast(StreamingDilocoServer, core.rule)
    fragments = [r.fragment for r in rule.rounds]
    assert len(fragments) >= 6 and fragments == [i % 3 for i in range(len(fragments))]
    # the transfers were long and ran concurrently with the steps
    for f in finals:
        assert f["push_s"] + f["pull_s"] > 0.3 * f["wall_s"], f
        assert f["compute_s"] + f["push_s"] + f["pull_s"] > 1.2 * f["wall_s"], f


async def test_streaming_diloco_over_http() -> None:
    params = StreamingDilocoParams(inner_steps=12, fragments=4, overlap_steps=2)
    core, finals = await run_http("streaming_diloco", workers=3, params=params, time_s=1.0)
    rule = cast(StreamingDilocoServer, core.rule)
    assert core.store.version >= 4
    assert {r.fragment for r in rule.rounds} == {0, 1, 2, 3}
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert all(f["steps"] >= 21 and f["bytes_up"] > 0 for f in finals)
    assert core.evals[-1].loss < core.evals[0].loss


@pytest.mark.parametrize(("values", "field_name"), [
    ({"fragments": 0}, "fragments"), ({"overlap_steps": -1}, "overlap_steps"),
    ({"inner_steps": 8, "overlap_steps": 8}, "overlap_steps"), ({"alpha": 1.5}, "alpha"),
    ({"inner_steps": 0}, "inner_steps"), ({"outer_lr": -1.0}, "outer_lr")])
def test_bad_parameters_name_the_parameter(values: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name):
        StreamingDilocoParams(**values)
