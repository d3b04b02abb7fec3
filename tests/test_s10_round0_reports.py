"""A report that has arrived at the server counts though its worker then goes offline
(its work was done while it was online, as FedScale counts a client online when its work
completes); work still in progress when a worker goes offline is lost. Expected models
are worked out by hand in each test."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Push, ServerRule
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.fednova import FedNovaParams, FedNovaServer
from asyncsync.protocols.scaffold import ScaffoldParams, ScaffoldServer
from asyncsync.training.optim import FlatSGD


def store_of(workers: int) -> ParameterStore:
    store = ParameterStore(torch.zeros(3), workers, FlatSGD(0.1))
    store.live.update(range(workers))
    return store


def delta(worker: int, value: float, samples: int = 16, steps: int = 1,
          version: int = 0, **meta: Any) -> Push:
    return Push(worker, version, "delta", torch.full((3,), value), steps, samples, meta)


async def offline(rule: ServerRule[Any], worker: int) -> None:
    """As the server drops a worker that went offline."""
    rule.store.live.discard(worker)
    await rule.on_leave(worker)


def ranks(rule: ServerRule[Any]) -> set[int]:
    return {worker for worker, _ in rule.store.commits[-1].contributions}  # type: ignore[attr-defined]


def model(rule: ServerRule[Any]) -> float:
    w = rule.store.w
    assert torch.allclose(w, torch.full_like(w, float(w[0])))
    return float(w[0])


async def test_fedavg_counts_an_arrived_report_by_its_samples() -> None:
    rule = FedAvgServer(FedAvgParams(local_steps=1), store_of(3))
    await rule.on_push(delta(0, 1.0, samples=100))
    await rule.on_push(delta(1, 4.0, samples=300))
    await offline(rule, 1)  # its delta had arrived: it still counts
    assert rule.store.version == 0  # the round waits for worker 2, still online
    await rule.on_push(delta(2, 10.0, samples=100))
    assert rule.store.version == 1 and ranks(rule) == {0, 1, 2}
    assert abs(model(rule) - (100 * 1 + 300 * 4 + 100 * 10) / 500) < 1e-6  # 4.6


async def test_fedavg_loses_work_in_progress_when_its_worker_goes_offline() -> None:
    rule = FedAvgServer(FedAvgParams(local_steps=1), store_of(3))
    await rule.on_push(delta(0, 1.0, samples=100))
    await offline(rule, 1)  # still training: nothing of it arrived
    await rule.on_push(delta(2, 10.0, samples=100))
    assert rule.store.version == 1 and ranks(rule) == {0, 2}
    assert abs(model(rule) - 5.5) < 1e-6  # (100 x 1 + 100 x 10) / 200


async def test_a_round_whose_last_live_members_report_arrived_closes_when_they_go() -> None:
    rule = FedAvgServer(FedAvgParams(local_steps=1), store_of(3))
    await rule.on_push(delta(0, 2.0))
    await rule.on_push(delta(1, 4.0))
    await offline(rule, 2)  # the round now holds every live member's report
    assert rule.store.version == 1 and ranks(rule) == {0, 1}
    assert abs(model(rule) - 3.0) < 1e-6
    await offline(rule, 0)
    await offline(rule, 1)
    assert rule.store.version == 1 and not rule.pending[0]


async def test_fednova_shares_count_an_arrived_report() -> None:
    rule = FedNovaServer(FedNovaParams(), store_of(3))
    await rule.on_push(delta(0, 2.0, steps=2, shard=100))
    await rule.on_push(delta(1, 8.0, steps=4, shard=300))
    await offline(rule, 1)
    await rule.on_push(delta(2, 1.0, steps=1, shard=100))
    assert rule.store.version == 1 and ranks(rule) == {0, 1, 2}
    # p = (0.2, 0.6, 0.2); tau_eff = 0.2 x 2 + 0.6 x 4 + 0.2 x 1 = 3.0;
    # d_i = delta_i / tau_i = (1, 2, 1); w = 3.0 x (0.2 + 1.2 + 0.2) = 4.8
    assert abs(model(rule) - 4.8) < 1e-6


async def test_a_deadline_closes_with_the_report_of_a_worker_gone_offline() -> None:
    rule = FedAvgServer(FedAvgParams(local_steps=1, deadline_s=0.05), store_of(3))
    await rule.on_push(delta(0, 1.0))
    await rule.on_push(delta(1, 5.0))
    await offline(rule, 1)
    assert rule.store.version == 0  # worker 2 is online: the round waits, to its deadline
    await asyncio.sleep(0.3)
    assert rule.store.version == 1 and ranks(rule) == {0, 1}
    assert abs(model(rule) - 3.0) < 1e-6
    assert rule.rounds[-1].missing == {2}


async def test_a_worker_that_rejoins_before_its_round_closes_reports_anew() -> None:
    rule = FedAvgServer(FedAvgParams(local_steps=1), store_of(3))
    await rule.on_push(delta(0, 1.0))
    await rule.on_push(delta(1, 100.0))
    await offline(rule, 1)
    rule.store.live.add(1)
    await rule.on_join(1)  # back: it starts from the current model; its report is replaced
    assert 1 not in rule.pending[0] and 1 in rule.members()
    await rule.on_push(delta(2, 3.0))
    assert rule.store.version == 0  # waits for worker 1's new report
    await rule.on_push(delta(1, 5.0))
    assert rule.store.version == 1 and ranks(rule) == {0, 1, 2}
    assert abs(model(rule) - 3.0) < 1e-6  # (1 + 5 + 3) / 3


def control(worker: int, version: int, value: float) -> Push:
    return Push(worker, version, "control", torch.full((3,), value), 8, 128)


async def test_scaffold_counts_an_arrived_delta_with_its_control_variate() -> None:
    rule = ScaffoldServer(ScaffoldParams(), store_of(3))
    for worker, value in ((0, 1.0), (2, 100.0)):
        await rule.on_push(control(worker, 0, value))
        await rule.on_push(delta(worker, value, samples=128, steps=8))
    await rule.on_push(control(1, 0, 3.0))
    await offline(rule, 2)  # its delta and c_i+ had arrived: both count
    await rule.on_push(delta(1, 3.0, samples=128, steps=8))
    assert rule.store.version == 1 and ranks(rule) == {0, 1, 2}
    assert torch.allclose(rule.control, torch.full((3,), 104 / 3))  # mean of 1, 100, 3
    assert abs(model(rule) - 104 / 3) < 1e-5  # x + mean delta (server lr 1)
    assert 2 not in rule.latest  # it left: its c_i is out of the next rounds' mean
    # worker 1 goes offline after its control variate, before its delta: its work is lost
    await rule.on_push(control(0, 1, 5.0))
    await rule.on_push(delta(0, 5.0, samples=128, steps=8, version=1))
    await rule.on_push(control(1, 1, 50.0))
    await offline(rule, 1)
    assert rule.store.version == 2 and ranks(rule) == {0}
    assert torch.allclose(rule.control, torch.full((3,), 5.0))  # worker 0's alone
    assert abs(model(rule) - (104 / 3 + 5)) < 1e-5
