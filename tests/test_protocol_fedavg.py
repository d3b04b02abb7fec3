"""FedAvg: deltas weighted by samples; each round trains only its sampled fraction C."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Collection

import pytest
import torch

from asyncsync.protocols.base import OutOfStep, Push, Refused, Unacceptable
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.testing import FakeStore
from tests.helpers import run_http, run_local


async def test_round_weights_deltas_by_samples() -> None:
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(40, generator=gen)
    store = FakeStore(w0, 3, lr=0.1)
    rule = FedAvgServer(FedAvgParams(), store)
    deltas = [torch.randn(40, generator=gen) for _ in range(3)]
    with pytest.raises(Refused) as err:
        await rule.on_push(Push(0, 0, "delta", deltas[0], 8, 0))
    assert isinstance(err.value, Unacceptable)
    for rank, samples in enumerate([10, 30, 60]):
        await rule.on_push(Push(rank, 0, "delta", deltas[rank], 8, samples))
    assert store.version == 1
    expected = w0 + 0.1 * deltas[0] + 0.3 * deltas[1] + 0.6 * deltas[2]
    assert torch.allclose(store.w, expected, atol=1e-6)
    # equal weights (local SGD) would land far from it
    assert not torch.allclose(store.w, w0 + sum(deltas) / 3, atol=1e-2)


async def sampled_rounds(params: FedAvgParams, workers: int, rounds: int,
                         live: Collection[int] | None = None) -> list[frozenset[int]]:
    """Drive a FedAvg server through `rounds` rounds and return who trained in each, as the
    server's refusals show it: every live worker pushes a delta (in a shuffled order), the
    sampled ones are taken, the others refused as out of step; the round must then close.

    With `live`, the other workers leave after the first round, and the rounds returned
    are those drawn afterwards (the first after the change is not returned)."""
    store = FakeStore(torch.zeros(6), workers, lr=0.1)
    rule = FedAvgServer(params, store)
    order = random.Random(12345)
    seen: list[frozenset[int]] = []
    total = rounds + (live is not None)
    while len(seen) < total:
        if live is not None and store.version == 1 and len(store.live) == workers:
            for worker in set(range(workers)) - set(live):
                await store.leave(rule, worker)
        version = store.version
        ranks = sorted(store.live)
        order.shuffle(ranks)
        taken = set()
        for worker in ranks:
            try:
                await rule.on_push(Push(worker, version, "delta", torch.ones(6), 1, 4))
            except OutOfStep:
                continue
            taken.add(worker)
        assert store.version == version + 1, "the sampled workers' deltas close the round"
        assert [w for w, _ in store.commits[-1].contributions] == [
            w for w in ranks if w in taken]
        if live is None or version >= 1:
            seen.append(frozenset(taken))
    return seen if live is None else seen[1:]


@pytest.mark.parametrize(("workers", "fraction", "count"),
                         [(10, 0.3, 3), (4, 0.5, 2), (5, 0.01, 1), (6, 0.45, 3), (3, 1.0, 3)])
async def test_each_round_samples_round_c_n_distinct_workers(workers: int, fraction: float,
                                                             count: int) -> None:
    chosen = await sampled_rounds(FedAvgParams(fraction=fraction, seed=5), workers, 200)
    assert all(len(ranks) == count for ranks in chosen), chosen
    assert set().union(*chosen) == set(range(workers))  # everybody is sampled some time
    if count < workers:
        assert len(set(chosen)) > 1  # drawn afresh, not one fixed subset


async def test_sampling_is_uniform_among_the_live_workers_only() -> None:
    params = FedAvgParams(fraction=0.3, seed=11)
    chosen = await sampled_rounds(params, 10, 400)
    frequency = Counter(w for ranks in chosen for w in ranks)
    # each worker is in 3 of 10 draws on average: 120 of 400 rounds (sd ~ 9)
    assert all(80 <= frequency[w] <= 160 for w in range(10)), frequency
    pairs = Counter(pair for ranks in chosen for pair in itertools.combinations(sorted(ranks), 2))
    assert len(pairs) == 45  # every pair of workers trained together at some point
    # with four of ten workers gone, rounds draw round(0.3 x 6) = 2 of the six still live
    live = {0, 2, 3, 5, 7, 8}
    chosen = await sampled_rounds(params, 10, 300, live=live)
    assert all(len(ranks) == 2 and ranks <= live for ranks in chosen), chosen
    frequency = Counter(w for ranks in chosen for w in ranks)
    assert set(frequency) == live
    assert all(60 <= frequency[w] <= 140 for w in live), frequency  # 100 each expected


async def test_sampling_is_reproducible_for_a_seed() -> None:
    first = await sampled_rounds(FedAvgParams(fraction=0.5, seed=3), 6, 60)
    assert await sampled_rounds(FedAvgParams(fraction=0.5, seed=3), 6, 60) == first
    other = await sampled_rounds(FedAvgParams(fraction=0.5, seed=4), 6, 60)
    assert sum(a != b for a, b in zip(first, other, strict=True)) >= 20


async def test_each_round_trains_exactly_its_sampled_clients() -> None:
    params = FedAvgParams(local_steps=2, fraction=0.5, seed=3)
    core, finals = await run_local("fedavg", [0.0, 0.0, 0.002, 0.002], params=params,
                                   time_s=1.0)
    commits = list(core.store.commits)
    assert len(commits) >= 10
    chosen = []
    for commit in commits:
        ranks = frozenset(w for w, _ in commit.contributions)
        assert len(ranks) == len(commit.contributions) == 2, commit
        assert all(base == commit.version - 1 for _, base in commit.contributions), commit
        chosen.append(ranks)
    assert len(set(chosen)) >= 3
    assert set().union(*chosen) == {0, 1, 2, 3}
    # the same seed draws the same clients as a server driven round by round in process
    driven = await sampled_rounds(params, 4, commits[-1].version)
    assert chosen == [driven[c.version - 1] for c in commits]
    # workers not sampled did not compute: total steps are 2 clients x H per round
    total = sum(f["steps"] for f in finals)
    assert len(commits) * 2 * 2 <= total <= (len(commits) + 1) * 2 * 2


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^fraction:"):
        FedAvgParams(fraction=0.0)
    with pytest.raises(ValueError, match=r"^fraction:"):
        FedAvgParams(fraction=1.5)
    with pytest.raises(ValueError, match=r"^local_steps:"):
        FedAvgParams(local_steps=0)


async def test_fedavg_over_http() -> None:
    core, finals = await run_http("fedavg", workers=3, params=FedAvgParams(4), time_s=1.0)
    assert core.store.version > 3
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert all(f["steps"] > 8 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
