"""Mutation testing of the round protocols found one over-selection rule no test held: an
over-selected FedAvg round whose members go offline before reporting, leaving fewer than
the k reports it closes with, closes with every remaining member's report (k is capped by
its members) instead of waiting for reports that cannot come. Values by hand."""

from __future__ import annotations

import asyncio

import torch

from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.messages import Push
from asyncsync.protocols.testing import FakeStore


def test_a_round_left_with_fewer_than_k_members_closes_with_theirs() -> None:
    async def main() -> None:
        store = FakeStore(torch.zeros(2), 10)
        rule = FedAvgServer(FedAvgParams(fraction=0.3, overcommit=0.5, seed=3), store)
        members = sorted(rule.members())
        assert len(members) == 5  # k = 3 of 10, ceil(3 x 1.5) = 5 drawn
        for gone in members[:3]:
            await store.leave(rule, gone)
        stay = members[3:]
        for worker, value, samples in [(stay[0], 2.0, 10), (stay[1], 5.0, 30)]:
            await rule.on_push(Push(worker, 0, "delta", torch.full((2,), value), 4,
                                    samples))
        assert store.version == 1  # closed with the 2 reports its 2 members sent
        # weighted by samples: (10 x 2 + 30 x 5) / 40 = 4.25, server sgd at lr 1
        assert torch.allclose(store.w, torch.full((2,), 4.25))

    asyncio.run(main())
