"""Local SGD: each round averages exactly one H-step delta per worker, with equal weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import OutOfStep, Pull, Push, Refused
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_http, run_local


async def test_round_adds_the_mean_delta_and_releases_pulls_when_complete() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(50, generator=gen)
    store = ParameterStore(w0, 3, FlatSGD(0.1))
    store.live.update(range(3))
    rule = LocalSgdServer(LocalSgdParams(local_steps=4), store)
    deltas = [torch.randn(50, generator=gen) for _ in range(3)]

    await rule.on_push(Push(0, 0, "delta", deltas[0], 4, 10))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0)))
    await rule.on_push(Push(2, 0, "delta", deltas[2], 4, 99))
    with pytest.raises(Refused) as err:
        await rule.on_push(Push(2, 0, "delta", deltas[2], 4, 99))
    assert isinstance(err.value, OutOfStep)
    await asyncio.sleep(0.05)
    assert not waiting.done() and store.version == 0 and store.w is w0

    await rule.on_push(Push(1, 0, "delta", deltas[1], 4, 1))
    reply = await asyncio.wait_for(waiting, 5)
    assert store.version == reply.version == 1
    # equal weights, whatever the sample counts (10, 1, 99)
    expected = w0 + (deltas[0] + deltas[1] + deltas[2]) / 3
    assert torch.allclose(store.w, expected, atol=1e-6)
    assert sorted(store.commits[0].contributions) == [(0, 0), (1, 0), (2, 0)]


async def test_every_version_aggregates_one_h_step_delta_per_worker() -> None:
    steps = 4
    core, finals = await run_local("local_sgd", [0.0, 0.002, 0.008],
                                   params=LocalSgdParams(local_steps=steps), max_steps=48)
    commits = core.store.commits
    assert len(commits) >= 11
    for commit in commits:
        assert sorted(w for w, _ in commit.contributions) == [0, 1, 2], commit
        assert all(base == commit.version - 1 for _, base in commit.contributions), commit
    assert core.store.staleness.maximum == 0
    assert all(f["steps"] % steps == 0 and f["steps"] >= steps * 11 for f in finals)
    # the fast worker waited at the round barrier for the slow one
    assert core.store.held_s[0] > core.store.held_s.get(2, 0.0) + 0.1


def test_bad_local_steps_names_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^local_steps:"):
        LocalSgdParams(local_steps=0)


async def test_local_sgd_over_http() -> None:
    core, finals = await run_http("local_sgd", workers=3, params=LocalSgdParams(4), time_s=1.0)
    assert core.store.version > 3
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert all(f["steps"] > 8 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
