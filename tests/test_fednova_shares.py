"""FedNova weighs each normalized delta by its worker's share of the data, ``p_i = n_i / n``.

Before, every delta had ``p_i = 1/n`` whatever the shards' sizes (the server did not know
them): with a quantity-skewed partition a worker holding a tenth of the data counted as much
as one holding half.
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Push, Refused, RunStopped
from asyncsync.protocols.fednova import FedNovaParams, FedNovaServer, FedNovaWorker
from asyncsync.protocols.testing import FakeContext, FakeStore
from asyncsync.training.optim import FlatSGD


def store_of(w0: torch.Tensor, workers: int, num_params: int) -> ParameterStore:
    store = ParameterStore(w0.clone(), workers, FlatSGD(0.1), num_params=num_params)
    store.live.update(range(workers))
    return store


def round_of(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(10, dtype=torch.float64, generator=gen),
            [torch.randn(10, dtype=torch.float64, generator=gen) for _ in range(3)])


async def test_deltas_are_weighted_by_their_shards_share_of_the_data() -> None:
    w0, deltas = round_of(7)
    store = store_of(w0, 3, num_params=8)
    rule = FedNovaServer(FedNovaParams(), store)
    for worker, (steps, shard) in enumerate([(2, 10), (4, 30), (10, 60)]):
        await rule.on_push(Push(worker, 0, "delta", deltas[worker].clone(), steps, 32 * steps,
                                {"shard": shard}))
    assert store.version == 1
    p = [0.1, 0.3, 0.6]
    tau_eff = 0.1 * 2 + 0.3 * 4 + 0.6 * 10
    expected = w0 + tau_eff * (p[0] * deltas[0] / 2 + p[1] * deltas[1] / 4
                               + p[2] * deltas[2] / 10)
    assert torch.allclose(store.w[:8], expected[:8], rtol=1e-12)
    buffers = w0 + p[0] * deltas[0] + p[1] * deltas[1] + p[2] * deltas[2]
    assert torch.allclose(store.w[8:], buffers[8:], rtol=1e-12)


async def test_a_round_where_one_delta_says_no_shard_weighs_all_equally() -> None:
    w0, deltas = round_of(8)
    store = store_of(w0, 3, num_params=10)
    rule = FedNovaServer(FedNovaParams(), store)
    for worker, meta in enumerate([{"shard": 10}, {}, {"shard": 60}]):
        await rule.on_push(Push(worker, 0, "delta", deltas[worker].clone(), 5, 80, meta))
    assert torch.allclose(store.w, w0 + sum(deltas) / 3, rtol=1e-12)


@pytest.mark.parametrize("shard", ["10", True, 0, -3, 2**41, 1.5, [10]])
async def test_a_bad_shard_claim_is_refused_and_changes_nothing(shard: object) -> None:
    w0, deltas = round_of(9)
    store = store_of(w0, 1, num_params=10)
    rule = FedNovaServer(FedNovaParams(), store)
    with pytest.raises(Refused, match="'shard'"):
        await rule.on_push(Push(0, 0, "delta", deltas[0].clone(), 5, 80, {"shard": shard}))
    assert store.version == 0 and torch.equal(store.w, w0)


async def test_the_worker_sends_its_shards_size_with_its_delta() -> None:
    store = FakeStore(torch.ones(4), workers=1)
    ctx = FakeContext(store, FedNovaServer(FedNovaParams(local_steps=2), store), max_steps=6,
                      shard_size=123)
    with pytest.raises(RunStopped):
        await FedNovaWorker(FedNovaParams(local_steps=2)).run(ctx)
    assert [push.meta for push in ctx.pushed] == [{"shard": 123}] * 3
