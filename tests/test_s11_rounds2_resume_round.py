"""FedAvg's first round after a resume: the resumed server (version > 0, no start barrier)
sees its workers rejoin one by one. Its first round is drawn at the first rejoin, and
until a report arrives it is topped up as the others rejoin, to the k = round(C n) of the
n workers back, keeping its members (the first is already training): the size a fresh
run's round 0 has (before, it was often the first worker alone)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.testing import FakeStore

WORKERS, FRACTION, SEEDS = 10, 0.3, 300


async def resumed(seed: int, overcommit: float = 0.0) -> tuple[FakeStore, FedAvgServer]:
    """A server resumed at version 5 (as from a checkpoint), its workers rejoined in order."""
    store = FakeStore(torch.zeros(4), WORKERS, live=[])
    store.version = 5
    rule = FedAvgServer(FedAvgParams(fraction=FRACTION, seed=seed, overcommit=overcommit),
                        store)
    for worker in range(WORKERS):
        await store.join(rule, worker)
    return store, rule


def test_the_first_round_after_a_resume_has_round_c_n_members() -> None:
    async def main() -> None:
        k = round(FRACTION * WORKERS)  # 3
        counts = [0] * WORKERS
        for seed in range(SEEDS):
            _, rule = await resumed(seed)
            assert len(rule.round) == k and 0 in rule.round, (seed, rule.round)
            for worker in rule.round:
                counts[worker] += 1
        # k(n) = round(0.3 n) grows 1 -> 2 at the 5th rejoin (one of workers 1..4 added)
        # and 2 -> 3 at the 9th (one of the 7 of 1..8 not yet in it): worker w in 1..4 is
        # in with probability 1/4 + 3/4 x 1/7 = 5/14, in 5..8 with 1/7, and 9 never
        for worker, p in [*((w, 5 / 14) for w in range(1, 5)), *((w, 1 / 7) for w in
                                                                 range(5, 9)), (9, 0.0)]:
            spread = 4.5 * (SEEDS * p * (1 - p)) ** 0.5
            assert counts[worker] == pytest.approx(SEEDS * p, abs=spread), (worker, counts)

    asyncio.run(main())


def test_over_selection_tops_up_to_ceil_k_times_one_plus_o() -> None:
    async def main() -> None:
        for seed in range(20):
            _, rule = await resumed(seed, overcommit=0.5)
            assert len(rule.round) == 5 and 0 in rule.round  # ceil(3 x 1.5) = 5
            assert rule.quorum(0) == 3  # it closes with the first k = 3 reports

    asyncio.run(main())
