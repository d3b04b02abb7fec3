"""ESync: the state oracle's rule, and balanced rounds under scripted slowdowns."""

from __future__ import annotations

import statistics

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import BadRequest, Refused
from asyncsync.protocols.esync import EsyncParams, EsyncServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_http, run_local


class Clock:
    """A settable stand-in for the store's clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_oracle_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    store = ParameterStore(torch.zeros(4), 3, FlatSGD(0.1))
    monkeypatch.setattr(store, "now", clock)
    store.live.update(range(3))
    rule = EsyncServer(EsyncParams(eps=0.5), store)
    for worker in range(3):  # everyone starts a step
        assert await rule.on_query(worker, {"k": 0}) == {"sync": False}
    # worker 0 (1 s steps) finished one: worker 2 has not, so the slowest is unknown
    clock.now = 101.0
    assert await rule.on_query(0, {"k": 1, "c": 1.0}) == {"sync": False}
    clock.now = 102.0
    assert await rule.on_query(1, {"k": 1, "c": 2.0}) == {"sync": False}
    # worker 2 (10 s steps) is the slowest: ready as soon as its step ends
    clock.now = 110.0
    assert await rule.on_query(2, {"k": 1, "c": 10.0}) == {"sync": True}
    assert await rule.on_query(2, {"k": 0, "c": 10.0}) == {"sync": False}  # never at k = 0
    # the slowest started a step at 110, ending at 120
    clock.now = 118.4  # 1.6 s left: 1.0 * 1.5 <= 1.6, worker 0 keeps computing
    assert await rule.on_query(0, {"k": 5, "c": 1.0}) == {"sync": False}
    clock.now = 118.6  # 1.4 s left < 1.5
    assert await rule.on_query(0, {"k": 6, "c": 1.0}) == {"sync": True}
    clock.now = 116.0  # 4 s left > 2 * 1.5 for worker 1
    assert await rule.on_query(1, {"k": 3, "c": 2.0}) == {"sync": False}
    # a worker whose step now takes longest becomes the slowest
    clock.now = 119.0
    assert await rule.on_query(1, {"k": 4, "c": 11.0}) == {"sync": True}


async def test_oracle_rejects_bad_queries_without_changing_state() -> None:
    rule = EsyncServer(EsyncParams(), ParameterStore(torch.zeros(4), 2, FlatSGD(0.1)))
    for meta in ({}, {"k": -1}, {"k": 1}, {"k": 1, "c": "slow"}, {"k": 1, "c": -1.0},
                 {"k": 1, "c": float("nan")}, {"k": True, "c": 1.0}):
        with pytest.raises(Refused) as err:
            await rule.on_query(0, meta)
        assert isinstance(err.value, BadRequest), meta
    assert await rule.on_query(0, {"k": 0}) == {"sync": False}


async def test_fast_workers_do_more_steps_and_barely_wait() -> None:
    delays = [0.004, 0.012, 0.06]
    core, finals = await run_local("esync", delays, time_s=2.5)
    rule = core.rule
    assert isinstance(rule, EsyncServer)
    rounds = list(rule.history)[1:]  # the first round includes start-up
    assert len(rounds) >= 15
    # every version is one round averaging the N deltas of that version
    for commit in core.store.commits:
        assert sorted(w for w, _ in commit.contributions) == [0, 1, 2]
        assert all(base == commit.version - 1 for _, base in commit.contributions)
    step_s = [f["compute_s"] / f["steps"] for f in finals]
    # the slowest is ready after each of its steps; the others fill its step with theirs
    ordered = [r for r in rounds if r.steps[0] >= r.steps[1] >= r.steps[2] == 1
               and r.steps[0] >= 3]
    assert len(ordered) >= 0.8 * len(rounds), [r.steps for r in rounds]
    for worker in (0, 1):
        ratio = step_s[2] / step_s[worker]  # steps that fit in one slow step
        mean_steps = statistics.mean(r.steps[worker] for r in rounds)
        assert 0.5 * ratio <= mean_steps <= ratio + 1, (worker, mean_steps, ratio)
    # nobody waits long at the barrier: a fraction of the slowest's step
    for worker in range(3):
        mean_wait = statistics.mean(r.held_s[worker] for r in rounds)
        assert mean_wait < 0.4 * step_s[2], (worker, mean_wait, step_s)
    assert statistics.mean(r.held_s[2] for r in rounds) < 0.01


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="eps"):
        EsyncParams(eps=-0.1)
    with pytest.raises(ValueError, match="eps"):
        EsyncParams(eps=float("inf"))


async def test_esync_over_http() -> None:
    core, finals = await run_http("esync", workers=3, time_s=1.0)
    assert core.store.version > 3
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
