"""Streaming DiLoCo: per-fragment outer steps on fragment-sized deltas; the staggered
schedule (torchft placement) and the merge ``(1 - alpha) global + alpha local``; overlap
hides a slow link."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import torch

from asyncsync.protocols.base import BadRequest, Pull, Push, Refused, RunStopped
from asyncsync.protocols.streaming_diloco import (
    StreamingDilocoParams,
    StreamingDilocoServer,
    StreamingDilocoWorker,
)
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
        with pytest.raises(Refused) as err:
            rule.tensor_numel("push", {"fragment": bad})
        assert isinstance(err.value, BadRequest)
    with pytest.raises(Refused) as unknown:
        await rule.on_push(Push(0, 0, "delta", torch.ones(3), 5, 80, {"fragment": 7}))
    assert isinstance(unknown.value, BadRequest)
    # a pull sent before its push waits for the round of its fragment
    early = asyncio.create_task(rule.on_pull(Pull(0, 0, {"fragment": 1})))
    await asyncio.sleep(0.02)
    assert not early.done()
    assert store.version == 0 and torch.equal(store.w, w0)

    # by hand, in float64: g = -mean delta; buf <- mu buf + g; w <- w - lr (g + mu buf)
    lr, mu = 0.7, 0.9
    a = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 0.0, 1.5])]
    b = [torch.tensor([0.0, 1.0, 1.0]), torch.tensor([2.0, 1.0, -1.0])]
    expected = w0.double().clone()

    replies = await outer_round(rule, a, {"fragment": 1})
    g = -(a[0] + a[1]).double() / 2
    buf1 = g.clone()
    expected[3:6] -= lr * (g + mu * buf1)
    first = await asyncio.wait_for(early, 1)
    assert first.vector is not None and first.meta == {"fragment": 1, "round": 0}
    for vector, version in [*replies, (first.vector, first.version)]:  # fragment-sized
        assert version == 1 and vector.shape == (3,)
        assert torch.allclose(vector.double(), expected[3:6], atol=1e-6)
    assert torch.allclose(store.w.double(), expected, atol=1e-6)
    assert torch.equal(store.w[:3], w0[:3]) and torch.equal(store.w[6:], w0[6:])

    await outer_round(rule, b, {"fragment": 0})  # fragment 0's momentum starts afresh
    g = -(b[0] + b[1]).double() / 2
    expected[0:3] -= lr * (g + mu * g)
    await outer_round(rule, b, {"fragment": 1})  # fragment 1's continues
    buf1 = mu * buf1 + g
    expected[3:6] -= lr * (g + mu * buf1)
    assert torch.allclose(store.w.double(), expected, atol=1e-6)
    assert torch.equal(store.w[6:], w0[6:])
    assert [(r.fragment, r.round, r.version) for r in rule.rounds] == [
        (1, 0, 1), (0, 0, 2), (1, 1, 3)]
    # each version took exactly one delta per live worker, for one fragment
    assert [sorted(c.contributions) for c in store.commits] == [
        [(0, 0), (1, 0)], [(0, 1), (1, 1)], [(0, 2), (1, 2)]]


async def test_fragment_buffers_take_the_workers_mean() -> None:
    # six parameters then two buffer slots; fragment 1 = (3, 8) holds both kinds
    w0 = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.25])
    store = make_store(w0.clone(), 2, num_params=6)
    rule = StreamingDilocoServer(StreamingDilocoParams(inner_steps=4, fragments=2,
                                                       overlap_steps=1), store)
    assert rule.bounds == [(0, 4), (4, 8)]
    deltas = [torch.tensor([0.5, 0.25, -0.25, -0.5]), torch.tensor([1.0, 0.75, -0.5, 0.25])]
    await outer_round(rule, deltas, {"fragment": 1})
    mean = (deltas[0] + deltas[1]) / 2
    assert torch.equal(store.w[6:], w0[6:] + mean[2:])  # the buffers' mean, exactly
    g = -mean[:2].double()
    assert torch.allclose(store.w[4:6].double(), w0[4:6].double() - 0.7 * (g + 0.9 * g),
                          atol=1e-6)
    assert torch.equal(store.w[:4], w0[:4])
    assert rule.state_dict()["outer.1.momentum"].shape == (2,)


def test_more_fragments_than_elements_is_refused() -> None:
    with pytest.raises(ValueError, match="fragments"):
        StreamingDilocoServer(StreamingDilocoParams(fragments=11), make_store(torch.zeros(10), 1))


async def test_worker_staggers_fragments_and_merges_tau_steps_later() -> None:
    h, tau, alpha = 4, 1, 0.25
    params = StreamingDilocoParams(inner_steps=h, fragments=2, overlap_steps=tau, alpha=alpha)

    def fresh(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((2,), 100.0 * (meta["fragment"] + 1) + number)

    # every answer needs one more local step: the worker must keep stepping meanwhile
    ctx = FakeContext(4, max_steps=14, reply=fresh, lag=tau)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(StreamingDilocoWorker(params).run(ctx.as_context()), 5)

    # by hand: fragment f (elements 2f, 2f+1) is merged after steps floor(h (f+1) / 2)
    # + 4k and pushed tau steps earlier; every step adds 1
    merge_at = {0: [2, 6, 10, 14], 1: [4, 8, 12]}
    push_at = {f: [step - tau for step in steps] for f, steps in merge_at.items()}
    local, anchor, version = [0.0, 0.0], [0.0, 0.0], 0
    pushes: list[tuple[int, int, float, int, int]] = []
    last = [0, 0]
    answers: dict[int, tuple[int, float]] = {}
    for step in range(1, 15):
        local = [v + 1 for v in local]
        for f in (0, 1):
            if step in push_at[f]:
                number = len(pushes)
                pushes.append((step, f, local[f] - anchor[f], step - last[f], version))
                answers[f] = (number, 100.0 * (f + 1) + number)
                last[f] = step
            if step in merge_at[f]:
                number, value = answers.pop(f)
                version = max(version, number + 1)
                local[f] = (1 - alpha) * value + alpha * local[f]
                anchor[f] = value
    assert not answers
    got = [(s.step, s.meta["fragment"], s.vector, s.steps, s.base_version) for s in ctx.sent]
    assert [(p[0], p[1], p[3], p[4]) for p in pushes] == [(g[0], g[1], g[3], g[4]) for g in got]
    assert [p[0] for p in pushes] == [1, 3, 5, 7, 9, 11, 13]
    for (_, _, value, _, _), (_, _, vector, _, _) in zip(pushes, got, strict=True):
        assert vector.shape == (2,) and torch.allclose(vector, torch.full((2,), value))
    assert all(s.kind == "delta" and s.samples == 16 * s.steps for s in ctx.sent)
    assert torch.allclose(ctx.local, torch.tensor([local[0]] * 2 + [local[1]] * 2))
    assert [(a.asked, a.answered) for a in ctx.answers] == [
        (s, s + tau) for s in (1, 3, 5, 7, 9, 11, 13)]
    assert not ctx.adopted  # fragments are merged, never adopted whole
    assert asyncio.all_tasks() == {asyncio.current_task()}


# H = 8, P = 4, tau = 1, written out by hand: fragment p is merged after local steps
# floor(8 (p + 1) / 4) + 8k and its exchange starts one step earlier
MERGES = {0: [2, 10, 18], 1: [4, 12, 20], 2: [6, 14], 3: [8, 16]}
PUSHES = {0: [1, 9, 17], 1: [3, 11, 19], 2: [5, 13], 3: [7, 15]}


def test_the_schedule_helpers_match_the_hand_written_schedule() -> None:
    params = StreamingDilocoParams(inner_steps=8, fragments=4, overlap_steps=1)
    for fragment in range(4):
        assert [s for s in range(21) if params.merges_after(s, fragment)] == MERGES[fragment]
        assert [s for s in range(21) if params.pushes_after(s, fragment)] == PUSHES[fragment]
    # floor placement when P does not divide H: 8 / 3 -> merges after 2, 5 and 8 (+ 8k)
    thirds = StreamingDilocoParams(inner_steps=8, fragments=3, overlap_steps=1)
    assert [[s for s in range(21) if thirds.merges_after(s, f)] for f in range(3)] == [
        [2, 10, 18], [5, 13], [8, 16]]
    assert [[s for s in range(21) if thirds.pushes_after(s, f)] for f in range(3)] == [
        [1, 9, 17], [4, 12, 20], [7, 15]]


async def test_worker_exchanges_and_merges_fragments_on_the_hand_written_schedule() -> None:
    params = StreamingDilocoParams(inner_steps=8, fragments=4, overlap_steps=1, alpha=0.5)

    def fresh(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((2,), 1000.0 * (meta["fragment"] + 1) + number)

    # 20 local steps; each answer arrives one step (tau) after its push
    ctx = FakeContext(8, max_steps=20, reply=fresh, lag=1)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(StreamingDilocoWorker(params).run(ctx.as_context()), 5)
    assert ctx.done == 20

    pushes = sorted((step, p) for p, steps in PUSHES.items() for step in steps)
    merges = sorted((step, p) for p, steps in MERGES.items() for step in steps)
    assert [(s.step, s.meta["fragment"]) for s in ctx.sent] == pushes
    assert [(m.step, m.start // 2) for m in ctx.mixes] == merges
    # each exchange carries its fragment's slice, pulled with the same fragment
    assert all(s.kind == "delta" and s.vector.shape == (2,) for s in ctx.sent)
    assert [(a.asked, a.meta["fragment"]) for a in ctx.answers] == pushes
    assert [(a.answered, a.meta["fragment"]) for a in ctx.answers] == merges
    # a fragment's first push counts the steps since the start, later ones H steps
    assert [(s.meta["fragment"], s.steps) for s in ctx.sent] == [
        (0, 1), (1, 3), (2, 5), (3, 7), (0, 8), (1, 8), (2, 8), (3, 8), (0, 8), (1, 8)]
    # each merge mixes its fragment's slice toward the answer of its own exchange
    for number, mix in enumerate(ctx.mixes):
        fragment = mix.start // 2
        assert (mix.start, mix.stop, mix.weight) == (2 * fragment, 2 * fragment + 2, 0.5)
        assert mix.target.tolist() == [1000.0 * (fragment + 1) + number] * 2
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_streaming_hides_a_slow_link_that_stalls_bsp() -> None:
    # a fragment's exchange every 6 steps, each with 5 steps (150 ms) to complete
    params = StreamingDilocoParams(inner_steps=18, fragments=3, overlap_steps=5)
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


@pytest.mark.parametrize(("inner_steps", "fragments", "overlap_steps"), [
    (8, 4, 2), (8, 4, 3), (8, 3, 2), (12, 4, 3), (4, 4, 1)])
def test_an_overlap_as_long_as_a_fragments_slot_is_refused(
        inner_steps: int, fragments: int, overlap_steps: int) -> None:
    # tau >= H // P: the exchange would not end before the next fragment's starts
    with pytest.raises(ValueError, match=r"^overlap_steps:"):
        StreamingDilocoParams(inner_steps=inner_steps, fragments=fragments,
                              overlap_steps=overlap_steps)
    accepted = StreamingDilocoParams(inner_steps=inner_steps, fragments=fragments,
                                     overlap_steps=inner_steps // fragments - 1)
    assert accepted.overlap_steps == inner_steps // fragments - 1


@pytest.mark.parametrize(("inner_steps", "fragments"), [(4, 5), (1, 2), (8, 9)])
def test_more_fragments_than_inner_steps_is_refused(inner_steps: int, fragments: int) -> None:
    with pytest.raises(ValueError, match=r"^fragments:"):
        StreamingDilocoParams(inner_steps=inner_steps, fragments=fragments, overlap_steps=0)
    StreamingDilocoParams(inner_steps=inner_steps, fragments=inner_steps, overlap_steps=0)
