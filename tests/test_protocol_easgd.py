"""EASGD: every tau local steps a worker and the center pull toward each other with weight
alpha; the worker keeps its own model (pulled toward the center, never overwritten) and the
center moves by alpha times the difference (summed over the round's workers when
synchronous)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Pull, Push, RunStopped, WorkerLoop
from asyncsync.protocols.easgd import (
    EasgdAsyncServer,
    EasgdAsyncWorker,
    EasgdParams,
    EasgdServer,
    EasgdWorker,
)
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.training.optim import FlatSGD
from tests.helpers import ranks, run_local
from tests.test_protocol_diloco import FakeContext

ALPHA = 0.25
TAU = 2
CENTERS = [torch.full((4,), 0.5), torch.full((4,), 1.0), torch.full((4,), -2.0)]


def fake_context() -> FakeContext:
    """A scripted worker: each local step adds 1; pull n answers ``CENTERS[n]``."""
    def reply(n: int, meta: dict[str, Any]) -> torch.Tensor:
        return CENTERS[n].clone()

    return FakeContext(numel=4, max_steps=3 * TAU, reply=reply)


async def run_until_stopped(loop: WorkerLoop, ctx: FakeContext) -> None:
    with pytest.raises(RunStopped):
        await loop.run(ctx.as_context())


async def test_sync_worker_is_pulled_toward_the_center_it_holds_never_overwritten() -> None:
    ctx = fake_context()
    await run_until_stopped(EasgdWorker(EasgdParams(local_steps=TAU, alpha=ALPHA)), ctx)
    # reference: the round's center is the one pulled after the previous round (at first,
    # the model the worker started from)
    x, center, differences = torch.zeros(4), torch.zeros(4), []
    for pulled in CENTERS:
        x = x + TAU
        differences.append(x - center)
        x = x - ALPHA * (x - center)
        center = pulled
    assert not ctx.adopted  # never overwritten
    assert torch.allclose(ctx.local, x)
    assert [s.kind for s in ctx.sent] == ["delta"] * 3
    assert all(torch.allclose(s.vector, d) for s, d in zip(ctx.sent, differences, strict=True))
    # each push belongs to the round of the center it was computed against
    assert [s.base_version for s in ctx.sent] == [0, 1, 2]
    assert [(m.step, m.weight) for m in ctx.mixes] == [(2, ALPHA), (4, ALPHA), (6, ALPHA)]


async def test_async_worker_reads_the_center_then_moves_toward_it() -> None:
    ctx = fake_context()
    await run_until_stopped(EasgdAsyncWorker(EasgdParams(local_steps=TAU, alpha=ALPHA)), ctx)
    x, differences = torch.zeros(4), []
    for center in CENTERS:
        x = x + TAU
        differences.append(x - center)
        x = x - ALPHA * (x - center)
    assert not ctx.adopted
    assert torch.allclose(ctx.local, x)
    assert all(torch.allclose(s.vector, d) for s, d in zip(ctx.sent, differences, strict=True))
    assert [s.base_version for s in ctx.sent] == [1, 2, 3]  # the version each center had


def live_store(w0: torch.Tensor, workers: int) -> ParameterStore:
    store = ParameterStore(w0.clone(), workers, FlatSGD(0.1))
    store.live.update(range(workers))
    return store


async def test_sync_center_moves_by_alpha_times_the_sum_of_differences() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(6, generator=gen)
    store = live_store(w0, 3)
    rule = EasgdServer(EasgdParams(alpha=0.2), store)
    d = [torch.randn(6, generator=gen) for _ in range(3)]
    await rule.on_push(Push(0, 0, "delta", d[0].clone(), TAU, 32))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0)))
    await rule.on_push(Push(2, 0, "delta", d[2].clone(), TAU, 32))
    assert store.version == 0 and not waiting.done()
    await rule.on_push(Push(1, 0, "delta", d[1].clone(), TAU, 32))
    reply = await asyncio.wait_for(waiting, 5)
    assert reply.version == store.version == 1
    assert torch.allclose(store.w, w0 + 0.2 * (d[0] + d[1] + d[2]))
    assert ranks(store.commits[-1]) == {0, 1, 2}


async def test_sync_with_alpha_one_over_n_makes_the_center_the_workers_mean() -> None:
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(6, generator=gen)
    store = live_store(w0, 4)
    rule = EasgdServer(EasgdParams(alpha=0.25), store)
    models = [torch.randn(6, generator=gen) for _ in range(4)]
    for worker, model in enumerate(models):
        await rule.on_push(Push(worker, 0, "delta", model - w0, TAU, 32))
    assert torch.allclose(store.w, torch.stack(models).mean(dim=0), atol=1e-6)


async def test_async_center_moves_by_alpha_times_each_difference_on_arrival() -> None:
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(6, generator=gen)
    store = live_store(w0, 2)
    rule = EasgdAsyncServer(EasgdParams(alpha=ALPHA), store)
    # a difference from the current center: the update is FedAsync's mixing of the
    # worker's model with constant weight alpha
    x = torch.randn(6, generator=gen)
    await rule.on_push(Push(0, 0, "delta", x - w0, TAU, 32))
    assert torch.allclose(store.w, torch.lerp(w0, x, ALPHA))
    # a difference computed against an older center still moves the current one
    d = torch.randn(6, generator=gen)
    before = store.w
    await rule.on_push(Push(1, 0, "delta", d.clone(), TAU, 32))
    assert store.version == 2 and torch.allclose(store.w, before + ALPHA * d)
    assert store.staleness.maximum == 1


def test_alpha_defaults_to_the_papers_beta_over_n() -> None:
    assert EasgdParams().weight(3) == pytest.approx(0.3)
    assert EasgdParams(alpha=0.1).weight(3) == 0.1
    assert EasgdServer(EasgdParams(), live_store(torch.zeros(2), 6)).alpha == pytest.approx(0.15)
    with pytest.raises(ValueError, match=r"^alpha: N alpha"):
        EasgdServer(EasgdParams(alpha=0.3), live_store(torch.zeros(2), 4))
    EasgdAsyncServer(EasgdParams(alpha=0.3), live_store(torch.zeros(2), 4))  # no sum: fine


@pytest.mark.parametrize("protocol", ["easgd", "easgd_async"])
async def test_easgd_trains_the_center(protocol: str) -> None:
    core, finals = await run_local(protocol, [0.0, 0.002, 0.01],
                                   params=EasgdParams(local_steps=4), time_s=2.0)
    assert core.store.version >= 20
    assert all(f["steps"] % 4 == 0 and f["steps"] >= 80 for f in finals)
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < core.evals[0].loss
    if protocol == "easgd":  # one difference per worker per version, all of that round
        assert all(ranks(c) == {0, 1, 2} for c in core.store.commits)
        assert core.store.staleness.maximum == 0
    else:  # nobody waited
        assert sum(core.store.held_s.values()) == 0.0
        assert finals[0]["steps"] > 2 * finals[2]["steps"]


def test_bad_parameters_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^local_steps:"):
        EasgdParams(local_steps=0)
    with pytest.raises(ValueError, match=r"^alpha:"):
        EasgdParams(alpha=1.0)
    with pytest.raises(ConfigError, match=r"^protocol\.alpha:"):
        from_mapping(EasgdParams, {"alpha": -0.1}, "protocol")
