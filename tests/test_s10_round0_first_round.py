"""FedAvg's round 0 is drawn like every other round: from the workers in the run when it
opens. A worker offline at the run's start (its availability trace) joins ``away``: it
counts for the start barrier and downloads the model, but no round, round 0 included,
is drawn from it or waits for it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.hetero.availability import load_availability
from asyncsync.protocols.base import BadRequest
from asyncsync.protocols.fedavg import FedAvgParams
from tests.helpers import tiny_model

RUN = "round0"
TRACE = """worker,online_from_s,online_to_s
0,0,100
1,50,100
2,0,30
3,0,100
4,10,100
5,0,100
6,70,90
7,0,100
"""
"""Eight workers; 1, 4 and 6 are offline at the start."""


def head(worker: int, secret: str, **fields: Any) -> dict[str, Any]:
    return {"run_id": RUN, "worker": worker, "meta": {}, "session": secret, **fields}


def offline_at_start(tmp_path: Path) -> set[int]:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return {rank for rank, times in enumerate(load_availability(path, 8))
            if not times.online_at(0.0)}


async def started(params: FedAvgParams, away: set[int]) -> tuple[ServerCore, list[str]]:
    """A FedAvg core of 8 workers, each joined (away when offline at the start)."""
    core = build_core(tiny_model(), "fedavg", 8, ServerSettings(run_id=RUN),
                      protocol_params=params)
    replies = await asyncio.gather(*(
        core.handle("join", head(w, "", **({"away": True} if w in away else {})), None)
        for w in range(8)))
    return core, [str(reply["meta"]["session"]) for reply, _ in replies]


async def finish(core: ServerCore) -> None:
    await core.stop()
    await core.close()


async def test_round_0_never_draws_a_worker_offline_at_the_start(tmp_path: Path) -> None:
    away = offline_at_start(tmp_path)
    assert away == {1, 4, 6}
    online = set(range(8)) - away
    k = max(1, round(0.5 * len(online)))  # 2.5 rounds to 2, as Python's round does
    seeds = 300
    drawn = dict.fromkeys(range(8), 0)
    for seed in range(seeds):
        core, _ = await started(FedAvgParams(local_steps=1, fraction=0.5, seed=seed), away)
        assert core.store.live == online
        first = core.rule.round  # type: ignore[attr-defined]
        assert len(first) == k and first <= online
        for worker in first:
            drawn[worker] += 1
        await finish(core)
    assert all(drawn[w] == 0 for w in away)
    for worker in online:  # each online worker is drawn with probability k / n_online
        assert abs(drawn[worker] / seeds - k / len(online)) < 0.1, drawn


async def test_overcommitted_round_0_waits_for_k_of_the_online_workers(
        tmp_path: Path) -> None:
    away = offline_at_start(tmp_path)
    online = set(range(8)) - away
    params = FedAvgParams(local_steps=1, fraction=0.5, overcommit=0.5, seed=3)
    core, sessions = await started(params, away)
    first = core.rule.round  # type: ignore[attr-defined]
    # k = round(0.5 x 5) = 2 of the 5 online; ceil(2 x 1.5) = 3 drawn; the first 2 close it
    assert len(first) == 3 and first <= online and core.rule.quorum(0) == 2
    for worker in sorted(first)[:2]:
        header = {**head(worker, sessions[worker]), "base_version": 0, "kind": "delta",
                  "steps": 1, "samples": 4, "seq": 1}
        numel = core.store.numel
        await core.handle("push", header, torch.ones(numel))
    assert core.store.version == 1
    await finish(core)


async def test_an_away_worker_rejoins_when_online_and_is_drawn_again(
        tmp_path: Path) -> None:
    params = FedAvgParams(local_steps=1)  # C = 1: every live worker, each round
    core, sessions = await started(params, {1, 4, 6})
    assert core.rule.round == {0, 2, 3, 5, 7}  # type: ignore[attr-defined]
    assert core.workers[4].state == "left"
    reply, _ = await core.handle("join", head(4, sessions[4]), None)  # back online
    assert 4 in core.store.live and 4 in core.rule.round  # type: ignore[attr-defined]
    assert reply["meta"]["session"] != sessions[4]
    await finish(core)


async def test_away_is_a_bool_and_only_for_a_first_join(tmp_path: Path) -> None:
    core = build_core(tiny_model(), "fedavg", 2, ServerSettings(run_id=RUN))
    with pytest.raises(BadRequest, match="'away' must be a bool"):
        await core.handle("join", head(0, "", away=1), None)
    core, sessions = await started(FedAvgParams(local_steps=1), set())
    with pytest.raises(BadRequest, match="'away' is for a first join"):
        await core.handle("join", head(3, sessions[3], away=True), None)
    assert 3 in core.store.live and core.store.version == 0  # nothing changed
    await finish(core)


async def test_round_0_first_drawn_at_a_rejoin_keeps_its_overcommit() -> None:
    """Round 0 is drawn at a rejoin, its first asking: k = round(0.5 x 6) = 3 of the 6
    live, ceil(3 x 1.5) = 5 drawn, and the first 3 reports close it."""
    core, sessions = await started(
        FedAvgParams(local_steps=1, fraction=0.5, overcommit=0.5, seed=5), {1, 4, 6})
    await core.handle("join", head(4, sessions[4]), None)  # before any other request
    assert len(core.rule.round) == 5 and core.rule.quorum(0) == 3  # type: ignore[attr-defined]
    await finish(core)
