"""FedAvg's local epochs (McMahan et al., AISTATS 2017): with unequal shards each client
runs ceil(E n_k / B) steps over E n_k samples, and the server's new model is
``w + sum_k (n_k / n) delta_k``, the deltas and weights computed here, not by the code under
test."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import pytest
import torch

from asyncsync.engine.core import ServerCore
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import Push, RunStopped
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer, FedAvgWorker
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer, LocalSgdWorker
from asyncsync.protocols.testing import FakeContext, FakeStore, checked_context
from asyncsync.study.simulation import run_virtual
from asyncsync.training.data import BatchSampler, Dataset
from asyncsync.training.trainer import Trainer
from tests.helpers import batches_of, tiny_data, tiny_model

LR = 0.1
"""FakeContext's local rate: a step of its default loss ``|w|^2 / 2`` is ``w <- (1 - LR) w``."""


async def _one_round(params: FedAvgParams, shards: list[int], batch: int
                     ) -> tuple[torch.Tensor, FakeStore, list[FakeContext]]:
    """One FedAvg round of FakeContexts with shards of `shards` samples: each context's step
    budget is one round's steps, so its loop stops (RunStopped) when the next round begins."""
    w0 = torch.linspace(-2.0, 3.0, 12)
    store = FakeStore(w0.clone(), len(shards))
    rule = FedAvgServer(params, store)
    contexts = [FakeContext(store, rule, rank=k, batch_size=batch, shard_size=n, lr=LR,
                            max_steps=math.ceil(params.local_epochs * n / batch))
                for k, n in enumerate(shards)]
    loops = [FedAvgWorker(params).run(checked_context(ctx)) for ctx in contexts]
    outcomes = await asyncio.gather(*loops, return_exceptions=True)
    assert all(isinstance(out, RunStopped) for out in outcomes), outcomes
    return w0, store, contexts


@pytest.mark.parametrize(("epochs", "batch"), [(1, 4), (2, 5), (3, 7)])
async def test_each_client_runs_ceil_e_nk_over_b_steps_and_counts_nk_over_n(
        epochs: int, batch: int) -> None:
    shards = [5, 12, 3, 20]
    w0, store, contexts = await _one_round(FedAvgParams(local_epochs=epochs), shards, batch)
    assert store.version == 1
    steps = [math.ceil(epochs * n / batch) for n in shards]
    for ctx, n, u in zip(contexts, shards, steps, strict=True):
        assert ctx.done == u  # the round's steps, and no more
        (push,) = ctx.pushed
        assert (push.steps, push.samples) == (u, epochs * n)
    # the deltas in closed form: u steps of w <- (1 - LR) w from w0
    deltas = [w0 * ((1 - LR) ** u - 1) for u in steps]
    total = sum(shards)
    expected = w0 + sum(n / total * d for n, d in zip(shards, deltas, strict=True))
    assert torch.allclose(store.w, expected, rtol=0, atol=1e-6)
    # not the mean, nor a weighting by steps: the shard sizes are what counts
    assert not torch.allclose(store.w, w0 + sum(deltas) / len(deltas), atol=1e-3)
    by_steps = w0 + sum(u / sum(steps) * d for u, d in zip(steps, deltas, strict=True))
    assert not torch.allclose(store.w, by_steps, atol=1e-4)


async def test_without_local_epochs_every_client_runs_h_full_batches() -> None:
    """The default is unchanged: H steps of B whatever the shard, equal samples."""
    params = FedAvgParams(local_steps=3)
    store = FakeStore(torch.ones(4), 2)
    rule = FedAvgServer(params, store)
    contexts = [FakeContext(store, rule, rank=k, batch_size=8, shard_size=n, max_steps=3)
                for k, n in enumerate([5, 40])]
    await asyncio.gather(*(FedAvgWorker(params).run(c) for c in contexts),
                         return_exceptions=True)
    assert [(c.done, c.pushed[0].steps, c.pushed[0].samples) for c in contexts] == [
        (3, 3, 24), (3, 3, 24)]


async def test_local_sgd_keeps_its_h_steps_and_equal_weights() -> None:
    store = FakeStore(torch.ones(4), 2)
    rule = LocalSgdServer(LocalSgdParams(local_steps=2), store)
    contexts = [FakeContext(store, rule, rank=k, batch_size=8, shard_size=n, max_steps=2)
                for k, n in enumerate([5, 40])]
    await asyncio.gather(*(LocalSgdWorker(LocalSgdParams(local_steps=2)).run(c)
                           for c in contexts), return_exceptions=True)
    assert [c.pushed[0].steps for c in contexts] == [2, 2]


class RecordingSampler(BatchSampler):
    """A `BatchSampler` that keeps every row it hands out."""

    def __init__(self, data: Dataset, indices: torch.Tensor, seed: int) -> None:
        super().__init__(data, indices, seed)
        self.drawn: list[int] = []

    def rows(self, batch_size: int) -> list[int]:
        picked = super().rows(batch_size)
        self.drawn += picked
        return picked


def _recording(pushes: list[Push], models: dict[int, torch.Tensor]) -> Any:
    """A `prepare` for `run_virtual` that keeps a copy of every push the rule takes and the
    model of every version the store commits."""
    def prepare(core: ServerCore) -> None:
        rule, store = core.rule, core.store
        models[0] = store.w.clone()
        on_push, commit = rule.on_push, store.commit

        async def recorded_push(push: Push) -> dict[str, Any]:
            pushes.append(Push(push.worker, push.base_version, push.kind,
                               push.vector.clone(), push.steps, push.samples, push.meta))
            return await on_push(push)

        def recorded_commit(vector: torch.Tensor, contributions: Any) -> None:
            models[store.version + 1] = vector.clone()
            commit(vector, contributions)

        rule.on_push = recorded_push  # type: ignore[method-assign]
        store.commit = recorded_commit  # type: ignore[method-assign]

    return prepare


def test_the_engine_runs_epochs_over_each_shard_and_weighs_by_shard_size() -> None:
    """In the engine (virtual time, BatchSamplers over shards of 20, 45 and 90 samples, two
    of three clients a round): every push is E n_k samples in ceil(E n_k / B) steps, and
    every version is the previous one plus the n_k-weighted mean of its round's deltas."""
    x, y = tiny_data()
    data = Dataset(x, y, x, y, 2)
    shards = {0: 20, 1: 45, 2: 90}
    starts = {0: 0, 1: 20, 2: 65}
    epochs, batch = 2, 16
    params = FedAvgParams(local_epochs=epochs, fraction=0.67, seed=1)
    pushes: list[Push] = []
    models: dict[int, torch.Tensor] = {}

    samplers = {rank: RecordingSampler(data, torch.arange(starts[rank], starts[rank] + n), rank)
                for rank, n in shards.items()}

    core, finals = run_virtual("fedavg", tiny_model, samplers.__getitem__, [0.0, 0.0, 0.0],
                               settings=ServerSettings(lr=0.1, time_s=1.0), params=params,
                               batch_size=batch, step_s=0.002, prepare=_recording(pushes, models))
    versions = core.store.version
    assert versions >= 5
    for push in pushes:
        n = shards[push.worker]
        assert (push.steps, push.samples) == (math.ceil(epochs * n / batch), epochs * n)
    unlike_the_mean = 0
    for version in range(1, versions + 1):
        round_pushes = [p for p in pushes if p.base_version == version - 1]
        assert len(round_pushes) == 2  # round(0.67 x 3) clients
        sizes = [shards[p.worker] for p in round_pushes]
        expected = models[version - 1] + sum(n / sum(sizes) * p.vector for n, p in
                                             zip(sizes, round_pushes, strict=True))
        assert torch.allclose(models[version], expected, rtol=0, atol=1e-6), version
        mean = models[version - 1] + sum(p.vector for p in round_pushes) / 2
        unlike_the_mean += not torch.allclose(models[version], mean, rtol=0, atol=1e-4)
    assert unlike_the_mean == versions  # the weights mattered in every round
    assert {p.worker for p in pushes} == set(shards)
    assert all(f["steps"] > 0 for f in finals)
    for rank, n in shards.items():  # a round is E passes over the shard: each sample E times
        rows = samplers[rank].drawn
        rounds = sum(p.worker == rank for p in pushes)
        assert len(rows) >= rounds * epochs * n
        for start in range(0, rounds * epochs * n, epochs * n):
            assert Counter(rows[start : start + epochs * n]) == dict.fromkeys(
                range(starts[rank], starts[rank] + n), epochs), (rank, start)


def test_backup_workers_drop_the_largest_shard_and_weigh_the_arrived_ones() -> None:
    """Equal step times, shards of 20, 45 and 90: the largest client's round is the longest,
    so with one backup worker every round closes with the two others, weighted 20 : 45, and
    the largest client's deltas are dropped as late (the bias the fedavg page states)."""
    x, y = tiny_data()
    data = Dataset(x, y, x, y, 2)
    bounds = {0: (0, 20), 1: (20, 65), 2: (65, 155)}
    pushes: list[Push] = []
    models: dict[int, torch.Tensor] = {}
    core, _ = run_virtual(
        "fedavg", tiny_model,
        lambda rank: BatchSampler(data, torch.arange(*bounds[rank]), rank), [0.0] * 3,
        settings=ServerSettings(lr=0.1, time_s=1.0), batch_size=16, step_s=0.002,
        params=FedAvgParams(local_epochs=1, backup_workers=1),
        prepare=_recording(pushes, models))
    late = [p for p in pushes if p.worker == 2]
    assert core.store.version >= 3 and late and core.rule.dropped() == len(late)
    for commit in core.store.commits:
        assert sorted(w for w, _ in commit.contributions) == [0, 1]
        taken = {p.worker: p for p in pushes if p.base_version == commit.version - 1
                 and p.worker in (0, 1)}
        expected = models[commit.version - 1] + (20 * taken[0].vector
                                                 + 45 * taken[1].vector) / 65
        assert torch.allclose(models[commit.version], expected, rtol=0, atol=1e-6)


def test_the_engine_context_tells_the_shard_size_of_a_batch_sampler_only() -> None:
    x, y = tiny_data()
    sampler = BatchSampler(Dataset(x, y, x, y, 2), torch.arange(37), 0)
    assert sampler.shard_size == 37
    assert Trainer(tiny_model(), sampler, device="cpu").shard_size == 37
    assert Trainer(tiny_model(), batches_of(x, y, 0), device="cpu").shard_size is None


def test_a_worker_without_a_shard_size_is_refused_naming_local_epochs() -> None:
    x, y = tiny_data()
    with pytest.raises(ValueError, match=r"^local_epochs: worker \d cannot count epochs"):
        run_virtual("fedavg", tiny_model, lambda rank: batches_of(x, y, rank), [0.0, 0.0],
                    settings=ServerSettings(lr=0.1, time_s=0.5),
                    params=FedAvgParams(local_epochs=1))


async def test_the_test_kit_refuses_an_unknown_shard_size_too() -> None:
    params = FedAvgParams(local_epochs=1)
    store = FakeStore(torch.ones(4), 1)
    ctx = FakeContext(store, FedAvgServer(params, store))
    with pytest.raises(ValueError, match=r"^local_epochs:"):
        await FedAvgWorker(params).run(ctx)
    assert ctx.done == 0 and not ctx.pushed


def test_bad_local_epochs_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"^local_epochs: must be >= 0"):
        FedAvgParams(local_epochs=-1)
    with pytest.raises(ValueError, match=r"^local_steps: not used with local_epochs"):
        FedAvgParams(local_epochs=2, local_steps=4)
    assert FedAvgParams(local_epochs=2).local_epochs == 2
