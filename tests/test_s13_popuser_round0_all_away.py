"""FedAvg's round 0 when every worker is offline at the run's start (all join ``away``, as
with a FedScale trace whose first client comes online after 0): it is drawn at the first
rejoin and, until a report arrives, topped up as the others come back, to k = round(C n)
of the n back, as after a resume (before, it was often the first worker back alone)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.testing import FakeStore

WORKERS, FRACTION, SEEDS = 10, 0.3, 300


async def all_back_in_order(seed: int) -> FedAvgServer:
    """A fresh server (version 0) none of whose workers was online at the start, its
    workers coming online one by one, 0 first."""
    store = FakeStore(torch.zeros(4), WORKERS, live=[])
    rule = FedAvgServer(FedAvgParams(fraction=FRACTION, seed=seed), store)
    for worker in range(WORKERS):
        await store.join(rule, worker)
    return rule


def test_round_0_of_an_all_away_start_has_round_c_n_members() -> None:
    async def main() -> None:
        k = round(FRACTION * WORKERS)  # 3
        counts = [0] * WORKERS
        for seed in range(SEEDS):
            rule = await all_back_in_order(seed)
            assert len(rule.round) == k and 0 in rule.round, (seed, rule.round)
            for worker in rule.round:
                counts[worker] += 1
        # k(n) = round(0.3 n): 1 up to n = 4, 2 from the 5th worker back (one of 1..4
        # drawn), 3 from the 9th (one of the 7 of 1..8 not in it): worker 1..4 is in with
        # probability 1/4 + 3/4 x 1/7 = 5/14, 5..8 with 1/7, 9 never
        for worker, p in [*((w, 5 / 14) for w in range(1, 5)),
                          *((w, 1 / 7) for w in range(5, 9)), (9, 0.0)]:
            spread = 4.5 * (SEEDS * p * (1 - p)) ** 0.5
            assert counts[worker] == pytest.approx(SEEDS * p, abs=spread), (worker, counts)
    asyncio.run(main())
