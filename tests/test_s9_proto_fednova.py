"""FedNova's ``max_steps`` caps a time budget's steps below the default H: with
``budget_s`` set, ``local_steps`` is not used (and refused), so ``max_steps`` is not bound by
it. It used to be refused as "must be >= local_steps (8)" even then."""

from __future__ import annotations

import pytest

from asyncsync.protocols.fednova import FedNovaParams, FedNovaServer
from tests.helpers import run_local


def test_a_budget_may_be_capped_below_the_default_h() -> None:
    assert FedNovaParams(budget_s=0.3, max_steps=3).max_steps == 3
    with pytest.raises(ValueError, match=r"^max_steps: must be >= local_steps \(8\), got 3"):
        FedNovaParams(max_steps=3)  # H steps per round: H = 8 > 3


async def test_the_fast_worker_stops_at_max_steps() -> None:
    # steps of 1 ms and 4 ms; a 20 ms budget holds 20 and 5 of them, capped at 3
    core, _ = await run_local("fednova", [0.0, 0.003],
                              params=FedNovaParams(budget_s=0.02, max_steps=3), time_s=0.5)
    assert isinstance(core.rule, FedNovaServer)
    rounds = list(core.rule.rounds)
    assert len(rounds) >= 10
    assert all(record.steps == {0: 3, 1: 3} for record in rounds), rounds[:3]
