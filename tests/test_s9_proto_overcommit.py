"""FedAvg's over-selection when the round samples every live worker (C = 1, or
``round(C n) = n``): nobody is left to over-select, so, as for local SGD, a round closes
with its first ``ceil(M / (1 + o))`` of its M members. It used to wait for all M (the
draw's k), so ``overcommit`` was accepted and did nothing."""

from __future__ import annotations

import math

from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.rounds import RoundServer
from tests.helpers import ranks, run_local


async def test_fedavg_sampling_everyone_closes_with_the_first_of_the_members() -> None:
    delays = [0.0, 0.001, 0.2]  # rank 2 is the straggler
    first = math.ceil(len(delays) / 1.5)  # = 2
    core, _ = await run_local("fedavg", delays, params=FedAvgParams(local_steps=2,
                                                                    overcommit=0.5),
                              time_s=1.0)
    rule = core.rule
    assert isinstance(rule, RoundServer)
    assert core.store.version >= 25
    assert all(len(ranks(c)) == first and ranks(c) == {0, 1} for c in core.store.commits)
    assert rule.late.get(2, 0) >= 2  # the straggler's reports were dropped and counted


async def test_fedavg_with_spare_workers_still_draws_them() -> None:
    """C < 1 with workers to spare: k = round(0.5 x 4) = 2 wanted of ceil(2 x 1.5) = 3
    drawn, as before."""
    core, _ = await run_local("fedavg", [0.0, 0.0, 0.0, 0.0],
                              params=FedAvgParams(local_steps=2, fraction=0.5,
                                                  overcommit=0.5), time_s=0.4)
    assert core.store.version >= 8
    assert all(len(ranks(c)) == 2 for c in core.store.commits)

