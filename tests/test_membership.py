"""Workers crash and rejoin: rounds stop waiting for a lost worker and count it again once
it is back; rule state survives a checkpoint. (The engine's refusal of pushes from before
a rejoin is tested in test_engine.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.engine.worker import RunStopped
from asyncsync.protocols.base import NoParams, OutOfStep, Pull, Push, Refused, ServerRule
from asyncsync.protocols.bsp import BspParams, BspServer
from asyncsync.protocols.diloco import DilocoParams, DilocoServer
from asyncsync.protocols.dssync import DsSyncParams, DsSyncServer
from asyncsync.protocols.easgd import EasgdParams
from asyncsync.protocols.esync import EsyncParams
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.fednova import FedNovaParams
from asyncsync.protocols.lbbsp import LbbspParams, LbbspServer
from asyncsync.protocols.local_sgd import LocalSgdParams
from asyncsync.protocols.nbsync import NbsyncParams
from asyncsync.protocols.overlap_local_sgd import OverlapLocalSgdParams
from asyncsync.protocols.scaffold import ScaffoldParams
from asyncsync.protocols.ssp import SspParams, SspServer
from asyncsync.protocols.streaming_diloco import (
    StreamingDilocoParams,
    StreamingDilocoServer,
    StreamingDilocoWorker,
)
from asyncsync.protocols.wbsp import WbspParams, WbspServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import ranks, run_crash_and_rejoin
from tests.test_protocol_diloco import FakeContext

STEPS = [0.005, 0.01, 0.02]

# protocol, params, step delays, the rank to kill, whether every commit is a full round
# (one contribution from each live worker)
CASES: list[tuple[str, Any, list[float], int, bool]] = [
    ("bsp", None, STEPS, 1, True),
    ("ssp", SspParams(2), STEPS, 2, False),
    ("local_sgd", LocalSgdParams(local_steps=2), STEPS, 1, True),
    ("fedavg", FedAvgParams(local_steps=2), STEPS, 1, True),
    ("esync", EsyncParams(), STEPS, 1, True),
    ("nbsync", NbsyncParams(server_mode="sync"), STEPS, 1, True),
    ("lbbsp", LbbspParams(global_batch=48), STEPS, 1, True),
    ("dssync", DsSyncParams(), [0.005] * 4, 1, False),
    ("wbsp", WbspParams(), [0.005, 0.01, 0.03], 2, False),
    ("wbsp_opt", WbspParams(), [0.005, 0.01, 0.03], 2, False),
    ("overlap_local_sgd", OverlapLocalSgdParams(local_steps=2), STEPS, 1, True),
    ("diloco", DilocoParams(inner_steps=3), STEPS, 1, True),
    ("streaming_diloco", StreamingDilocoParams(inner_steps=4, fragments=2, overlap_steps=1),
     STEPS, 1, True),
    ("bsp", BspParams(backup_workers=1), STEPS, 0, False),
    ("dcasgd", None, STEPS, 1, False),
    ("easgd", EasgdParams(local_steps=2), STEPS, 1, True),
    ("easgd_async", EasgdParams(local_steps=2), STEPS, 1, False),
    ("fednova", FedNovaParams(budget_s=0.03), STEPS, 1, True),
    ("scaffold", ScaffoldParams(local_steps=2), STEPS, 1, True),
]


@pytest.mark.parametrize(("protocol", "params", "delays", "victim", "full"), CASES,
                         ids=[case[0] + ("-backup" if isinstance(case[1], BspParams) else "")
                              for case in CASES])
async def test_a_lost_worker_is_dropped_and_a_rejoined_one_counted_again(
        protocol: str, params: Any, delays: list[float], victim: int, full: bool) -> None:
    run = await run_crash_and_rejoin(protocol, delays, victim, params=params)
    core = run.core
    assert core.workers[victim].lost == 1
    others = set(range(len(delays))) - {victim}
    # after the loss, versions advanced on the remaining workers' contributions only (the
    # first one may still carry what the victim sent before it crashed)
    without = run.between(run.lost_at + 2, run.restarted_at)
    assert len(without) >= 2, (run.lost_at, run.restarted_at)
    for commit in without:
        assert ranks(commit) <= others, commit
        if full:
            assert ranks(commit) == others, commit
    # and once it rejoined, commits include it again
    back = [c for c in run.between(run.restarted_at + 1, core.store.version)
            if victim in ranks(c)]
    assert back
    if full:
        assert ranks(back[0]) == set(range(len(delays))), back[0]


def live_store(vector: torch.Tensor, workers: int) -> ParameterStore:
    store = ParameterStore(vector, workers, FlatSGD(1.0))
    store.live.update(range(workers))
    return store


async def leave(rule: ServerRule, worker: int) -> None:
    """As the server drops a worker: out of the live set, then the rule's hook."""
    rule.store.live.discard(worker)
    await rule.on_leave(worker)


async def join(rule: ServerRule, worker: int) -> None:
    """As the server takes a worker back: into the live set, then the rule's hook."""
    rule.store.live.add(worker)
    await rule.on_join(worker)


async def refused(rule: ServerRule, push: Push) -> str:
    """The 409's reason; the store must be unchanged."""
    version, w = rule.store.version, rule.store.w
    with pytest.raises(Refused) as err:
        await rule.on_push(push)
    assert isinstance(err.value, OutOfStep)
    assert rule.store.version == version and rule.store.w is w
    return err.value.reason


def gradient(worker: int, version: int, value: float) -> Push:
    return Push(worker, version, "gradient", torch.full((4,), value), 1, 16)


async def test_barrier_keeps_a_lost_workers_arrived_push_and_waits_for_a_rejoined_one(
) -> None:
    store = live_store(torch.zeros(4), 3)
    rule = BspServer(NoParams(), store)
    await rule.on_push(gradient(0, 0, 1.0))
    await rule.on_push(gradient(1, 0, 10.0))
    await leave(rule, 1)  # its gradient arrived: it counts; the round waits for worker 2
    assert store.version == 0
    await rule.on_push(gradient(2, 0, 3.0))
    assert store.version == 1 and ranks(store.commits[-1]) == {0, 1, 2}
    assert torch.allclose(store.w, torch.full((4,), -14 / 3))  # the mean of 1, 10, 3, lr 1

    await rule.on_push(gradient(0, 1, 1.0))
    await leave(rule, 2)  # the round now has every live worker's gradient: it closes
    assert store.version == 2 and ranks(store.commits[-1]) == {0}

    await join(rule, 1)
    assert "round in progress is at version 2" in await refused(rule, gradient(1, 0, 5.0))
    assert not rule.pending[0]
    await rule.on_push(gradient(0, 2, 1.0))
    assert store.version == 2  # waits for the rejoined worker
    await rule.on_push(gradient(1, 2, 3.0))
    assert store.version == 3 and ranks(store.commits[-1]) == {0, 1}


async def test_fedavg_draws_a_new_round_when_no_participant_is_left() -> None:
    store = live_store(torch.zeros(4), 4)
    rule = FedAvgServer(FedAvgParams(local_steps=1, fraction=0.5, seed=1), store)
    drawn = rule.round
    assert len(drawn) == 2
    for worker in drawn:
        await leave(rule, worker)
    assert len(rule.round) == 1 and rule.round <= store.live  # half of the two left
    pulls = [asyncio.create_task(rule.on_pull(Pull(w, 0))) for w in sorted(rule.round)]
    replies = await asyncio.wait_for(asyncio.gather(*pulls), 5)
    assert all(reply.version == 0 for reply in replies)
    outsider = next(w for w in sorted(store.live) if w not in rule.round)
    reason = await refused(rule, Push(outsider, 0, "delta", torch.ones(4), 1, 16))
    assert "does not take part" in reason


async def test_ssp_rejoined_worker_restarts_at_the_slowest_live_clock() -> None:
    store = live_store(torch.zeros(4), 3)
    rule = SspServer(SspParams(2), store)
    for worker, count in ((0, 3), (1, 2), (2, 1)):
        for _ in range(count):
            await rule.on_push(Push(worker, store.version, "gradient", torch.zeros(4), 1, 16))
    assert rule.gap(0) == 2  # held back by worker 2
    await leave(rule, 2)
    assert rule.gap(0) == 1  # worker 2 no longer counts
    await join(rule, 2)
    assert rule.clocks[2] == 2 and rule.gap(0) == 1


async def test_wbsp_without_its_slow_worker_detects_another() -> None:
    store = live_store(torch.zeros(4), 3)
    rule = WbspServer(WbspParams(slow_worker=2), store)
    delta = torch.ones(4)
    await rule.on_push(Push(0, 0, "delta", delta, 1, 16))
    await leave(rule, 2)  # the fixed slow worker is gone: the slowest is detected
    await rule.on_push(Push(1, 0, "delta", delta, 1, 16))
    assert store.version == 1  # worker 1, without a rate yet, counts as slowest
    assert torch.allclose(store.w, torch.full((4,), 1 / 3 + 1 / 2))  # 1/n: n live workers
    await join(rule, 2)
    await rule.on_push(Push(2, 1, "delta", delta, 1, 16))
    assert store.version == 2 and rule.pushes[-1].published


async def test_wbsp_rejoined_worker_counts_as_slowest_until_measured() -> None:
    store = live_store(torch.zeros(4), 3)
    rule = WbspServer(WbspParams(), store)

    async def push(worker: int) -> bool:
        await rule.on_push(Push(worker, store.version, "delta", torch.ones(4), 1, 16))
        return rule.pushes[-1].published

    for _ in range(2):  # every worker's step rate is measured
        for worker in range(3):
            await push(worker)
    await leave(rule, 2)
    await join(rule, 2)
    assert not await push(0)  # the rejoined worker, not measured yet, is the slowest
    assert await push(2)


async def test_dssync_completes_groups_without_a_lost_member() -> None:
    store = live_store(torch.zeros(3), 4)
    rule = DsSyncServer(DsSyncParams(), store)
    models = [torch.full((3,), float(2 ** i)) for i in range(4)]  # 1, 2, 4, 8

    def push(worker: int, iteration: int) -> Push:
        return Push(worker, store.version, "model", models[worker], 1, 16,
                    {"iteration": iteration})

    # iteration 0: {0,1} {2,3}; worker 1 is lost before pushing, worker 3 after
    await rule.on_push(push(0, 0))
    await rule.on_push(push(3, 0))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0, {"iteration": 0})))
    await leave(rule, 1)
    reply = await asyncio.wait_for(waiting, 5)
    assert reply.meta["group"] == [0] and reply.vector is not None
    assert torch.equal(reply.vector, models[0])
    await leave(rule, 3)  # its push is withdrawn: worker 2 will average alone
    await rule.on_push(push(2, 0))
    assert [a.members for a in rule.averages] == [(0,), (2,)]
    # the evaluated vector is the mean of the live workers' latest models
    assert torch.equal(rule.eval_vector(), torch.full((3,), 2.5))

    # worker 1 rejoins at the first iteration nobody has pushed yet
    await join(rule, 1)
    assert await rule.on_query(1, {}) == {"iteration": 1}
    await refused(rule, push(1, 0))
    with pytest.raises(Refused):
        await rule.on_pull(Pull(1, store.version, {"iteration": 0}))
    # iteration 1: {0,3} {1,2}; worker 1 is expected again
    await rule.on_push(push(2, 1))
    assert [a.members for a in rule.averages][-1] == (2,)  # unchanged: waits for worker 1
    await rule.on_push(push(1, 1))
    assert rule.averages[-1].members == (1, 2) and ranks(store.commits[-1]) == {1, 2}


async def test_lbbsp_splits_the_global_batch_among_the_live_workers() -> None:
    store = live_store(torch.zeros(4), 3)
    rule = LbbspServer(LbbspParams(global_batch=60), store)
    assert await rule.on_query(1, {}) == {"batch_size": 20}

    def push(worker: int, samples: int, seconds: float) -> Push:
        return Push(worker, store.version, "gradient", torch.ones(4), 1, samples,
                    {"compute_s": seconds})

    await rule.on_push(push(0, 20, 1.0))
    await leave(rule, 1)
    await rule.on_push(push(2, 20, 1.0))
    assert store.version == 1 and ranks(store.commits[-1]) == {0, 2}
    assert rule.batches[0] + rule.batches[2] == 60  # X stays fixed among the live workers
    await join(rule, 1)
    assert await rule.on_query(1, {}) == {"batch_size": 20}  # an equal share for now
    await rule.on_push(push(0, rule.batches[0], 1.0))
    await rule.on_push(push(2, rule.batches[2], 1.0))
    assert store.version == 1  # waits for the rejoined worker
    await rule.on_push(push(1, 20, 1.0))
    assert store.version == 2 and sum(rule.batches.values()) == 60


async def test_round_server_counts_a_lost_workers_arrived_delta_and_a_rejoined_one() -> None:
    store = live_store(torch.zeros(4), 3)
    rule = DilocoServer(DilocoParams(outer_momentum=0.0, outer_lr=1.0), store)
    await rule.on_push(gradient(0, 0, 1.0))
    await rule.on_push(gradient(2, 0, 9.0))
    await leave(rule, 2)  # its delta arrived before it left: it counts
    await rule.on_push(gradient(1, 0, 3.0))
    assert store.version == 1 and ranks(store.commits[-1]) == {0, 1, 2}
    assert torch.allclose(store.w, torch.full((4,), 13 / 3))  # w + mean(1, 9, 3), outer lr 1
    await join(rule, 2)
    await rule.on_push(gradient(2, 1, 1.0))
    assert store.version == 1  # the round waits for workers 0 and 1 as well
    await rule.on_push(gradient(0, 1, 1.0))
    await leave(rule, 1)
    assert store.version == 2 and ranks(store.commits[-1]) == {0, 2}


async def test_diloco_outer_momentum_survives_a_checkpoint() -> None:
    def rule_of(w: torch.Tensor) -> DilocoServer:
        return DilocoServer(DilocoParams(), live_store(w, 2))

    first = rule_of(torch.zeros(4))
    assert first.state_dict() == {}
    for worker in range(2):
        await first.on_push(gradient(worker, 0, float(worker + 1)))
    state = first.state_dict()
    assert list(state) == ["outer.0.momentum"]
    resumed = rule_of(first.store.w.clone())
    resumed.load_state_dict({k: v.clone() for k, v in state.items()})
    for rule in (first, resumed):
        for worker in range(2):
            await rule.on_push(gradient(worker, rule.store.version, 1.0))
    assert torch.equal(first.store.w, resumed.store.w)
    with pytest.raises(ValueError, match="fragment 0"):
        rule_of(torch.zeros(4)).load_state_dict({"outer.0.momentum": torch.zeros(3)})


async def test_streaming_worker_starts_where_the_schedule_stands() -> None:
    params = StreamingDilocoParams(inner_steps=4, fragments=2, overlap_steps=1)
    rule = StreamingDilocoServer(params, live_store(torch.zeros(4), 1))
    assert await rule.on_query(0, {}) == {"step": 0}
    # H = 4, P = 2, tau = 1: fragment 0 is pushed after steps 1, 5, 9, ..., fragment 1
    # after steps 3, 7, 11, ... (each merged one step later)
    for fragment in (0, 1, 0):  # exchanged after steps 1, 3 and 5
        await rule.on_push(Push(0, rule.store.version, "delta", torch.zeros(2), 4, 64,
                                {"fragment": fragment}))
    assert await rule.on_query(0, {}) == {"step": 5}

    # a rejoined worker at step 5: the next exchanges are fragment 1 (after step 7), then
    # 0 (9), then 1 (11): 2, 4 and 6 steps into its loop
    ctx = FakeContext(4, max_steps=7, reply=lambda n, meta: torch.zeros(2), start_step=5)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(StreamingDilocoWorker(params).run(ctx.as_context()), 5)
    assert [(s.step, s.meta["fragment"], s.steps) for s in ctx.sent] == [
        (2, 1, 2), (4, 0, 4), (6, 1, 4)]
