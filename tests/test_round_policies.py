"""Round policies of every round-based protocol: over-selection, fixed and adaptive
deadlines, on the virtual clock."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.compute import InlineServerSeam, VirtualWorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import ComputeProfile, FixedStepCost
from asyncsync.protocols.base import Push
from asyncsync.protocols.bsp import BspParams
from asyncsync.protocols.deadlines import RoundDurations, median_plus_mad, quantile
from asyncsync.protocols.diloco import DilocoParams
from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.fedbuff import FedBuffParams
from asyncsync.protocols.fednova import FedNovaParams
from asyncsync.protocols.local_sgd import LocalSgdParams
from asyncsync.protocols.rounds import RoundRecord, RoundServer
from asyncsync.protocols.scaffold import ScaffoldParams
from asyncsync.protocols.streaming_diloco import StreamingDilocoParams
from asyncsync.study.simulation import run_virtual
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, ranks, run_local, tiny_data, tiny_model


# ---- over-selection -----------------------------------------------------------------------
async def test_over_selection_keeps_exactly_the_first_k_reports() -> None:
    arrivals: list[tuple[int, int]] = []  # (base version, worker), in arrival order

    def spy(core: ServerCore) -> ServerCore:
        rule = core.rule
        taken = rule.on_push

        async def on_push(push: Push) -> dict[str, Any]:
            arrivals.append((push.base_version, push.worker))
            return await taken(push)

        rule.on_push = on_push  # type: ignore[method-assign]
        return core

    delays = [0.001 * (1 + (7 * rank) % 10) for rank in range(10)]
    params = FedAvgParams(local_steps=2, fraction=0.5, overcommit=0.4, seed=3)
    x, y = tiny_data()
    core, _ = await asyncio.to_thread(
        run_virtual, "fedavg", tiny_model, lambda rank: batches_of(x, y, rank), delays,
        settings=ServerSettings(lr=0.1, time_s=2.0, eval_interval_s=1.0), params=params,
        step_s=0.001, batch_size=16, prepare=spy)
    rule = core.rule
    assert isinstance(rule, RoundServer)
    rounds = list(rule.rounds)
    assert len(rounds) > 20
    for record in rounds:
        base = record.version - 1
        first = [w for v, w in arrivals if v == base][:5]
        assert len(record.steps) == 5 and set(record.steps) == set(first), record
        assert len(record.missing) <= 2  # the over-selected 7 - 5
    # every report of a closed round beyond the first 5 was dropped and counted
    closed = {r.version - 1 for r in rounds}
    extra = sum(max(0, sum(1 for v, _ in arrivals if v == base) - 5) for base in closed)
    assert extra > 0 and rule.dropped() >= extra


def test_over_selection_draws_ceil_k_times_one_plus_overcommit() -> None:
    from asyncsync.protocols.fedavg import FedAvgServer
    from asyncsync.protocols.testing import FakeStore

    store = FakeStore(tiny_model_vector(), workers=20)
    rule = FedAvgServer(FedAvgParams(fraction=0.5, overcommit=0.3), store)
    assert len(rule.round) == 13 and rule.wanted == 10  # ceil(10 x 1.3)
    rule = FedAvgServer(FedAvgParams(fraction=0.35, overcommit=0.3), store)
    assert len(rule.round) == 10 and rule.wanted == 7  # ceil(7 x 1.3) = 10
    rule = FedAvgServer(FedAvgParams(fraction=0.9, overcommit=0.3), store)
    assert len(rule.round) == 20 and rule.wanted == 18  # no more than there are


def tiny_model_vector() -> Any:
    import torch

    return torch.cat([p.detach().flatten() for p in tiny_model().parameters()])


# ---- a fixed deadline, every round protocol -----------------------------------------------
ROUND_PROTOCOLS = {
    "local_sgd": LocalSgdParams(local_steps=2, deadline_s=0.01),
    "fedavg": FedAvgParams(local_steps=2, deadline_s=0.01),
    "fednova": FedNovaParams(local_steps=2, deadline_s=0.01),
    "scaffold": ScaffoldParams(local_steps=2, deadline_s=0.01),
    "diloco": DilocoParams(inner_steps=2, deadline_s=0.01),
    "bsp": BspParams(deadline_s=0.01),
}


@pytest.mark.parametrize("protocol", sorted(ROUND_PROTOCOLS))
async def test_a_deadline_closes_rounds_without_the_straggler_which_goes_on(
        protocol: str) -> None:
    core, finals = await run_local(protocol, [0.0, 0.0, 0.2], params=ROUND_PROTOCOLS[protocol],
                                   time_s=3.0)
    rule = core.rule
    assert isinstance(rule, RoundServer)
    assert core.store.version >= 50
    assert all(ranks(c) <= {0, 1} for c in core.store.commits)  # never waited for 2
    # the straggler's reports were dropped and counted; it pulled the new model and went on
    assert finals[2]["steps"] >= 6 and rule.late[2] >= 2
    assert rule.dropped() == sum(rule.late.values())
    assert core.workers[2].joined_at == 0  # no rejoin: carried on
    assert core.evals[-1].loss < core.evals[0].loss


@pytest.mark.parametrize("protocol", ["local_sgd", "bsp"])
async def test_over_selection_without_a_draw_closes_with_the_first_of_the_members(
        protocol: str) -> None:
    params = (LocalSgdParams(local_steps=2, overcommit=0.5) if protocol == "local_sgd"
              else BspParams(overcommit=0.5))
    core, _ = await run_local(protocol, [0.0, 0.001, 0.2], params=params, time_s=2.0)
    assert core.store.version >= 50
    assert all(ranks(c) == {0, 1} for c in core.store.commits)  # ceil(3 / 1.5) = 2


def test_round_policies_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="choose one kind of deadline"):
        FedAvgParams(deadline_s=1.0, deadline_quantile=0.9)
    with pytest.raises(ValueError, match="choose one way"):
        BspParams(backup_workers=1, overcommit=0.3)
    with pytest.raises(ValueError, match="deadline_window"):
        LocalSgdParams(deadline_mad_k=2.0, deadline_window=2)
    with pytest.raises(ValueError, match=r"^deadline_s: not offered by streaming DiLoCo"):
        StreamingDilocoParams(deadline_s=1.0)
    with pytest.raises(ValueError, match=r"^deadline_window: only an adaptive deadline"):
        FedAvgParams(deadline_window=5)
    assert FedAvgParams(deadline_quantile=0.9, deadline_window=5).deadline_window == 5


@pytest.mark.parametrize("key", ["backup_workers", "deadline_s", "overcommit",
                                 "deadline_quantile", "deadline_mad_k"])
def test_fedbuff_refuses_the_round_policies_it_inherits(key: str) -> None:
    """FedBuff has no rounds: these keys were accepted and did nothing."""
    with pytest.raises(ValueError, match=f"^{key}: not offered by fedbuff"):
        FedBuffParams(**{key: 1 if key == "backup_workers" else 0.5})


# ---- the adaptive deadline ----------------------------------------------------------------
def test_quantile_and_median_plus_mad_by_hand() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.75) == 4.0
    assert quantile(values, 0.9) == pytest.approx(4.0 + 0.6 * 6.0)
    # median 3, deviations 2 1 0 1 7 -> MAD 1
    assert median_plus_mad(values, 2.0) == 5.0


def test_round_durations_count_late_reports_and_forget_old_rounds() -> None:
    durations = RoundDurations(window=3, quantile=0.5)
    for number, spread in enumerate([1.0, 2.0]):
        durations.report(number, 10.0 * number)
        durations.report(number, 10.0 * number + spread)
    assert durations.deadline() is None  # two rounds known
    durations.report(2, 30.0)
    durations.report(2, 33.0)  # e.g. a late report
    assert durations.deadline() == 2.0  # median of 1, 2, 3
    durations.report(3, 40.0)
    durations.report(3, 49.0)  # round 0 leaves the window
    assert durations.deadline() == 3.0  # median of 2, 3, 9


class StepChange(ComputeProfile):
    """A step delay that changes at run time `at` (every worker's at once)."""

    def __init__(self, before: float, after: float, at: float) -> None:
        self.before, self.after, self.at = before, after, at

    def padding(self, t: float, compute_s: float) -> float:
        return self.before if t < self.at else self.after


def run_step_change(params: Any, before: list[float], scale: float, at: float,
                    time_s: float) -> TimedRounds:
    """bsp on the virtual clock, each worker's step delay multiplied by `scale` at `at`;
    returns its closed rounds with the times they closed."""
    x, y = tiny_data()

    async def main() -> TimedRounds:
        core = build_core(tiny_model(), "bsp", len(before),
                          ServerSettings(lr=0.1, time_s=time_s, eval_interval_s=1.0),
                          protocol_params=params, test_data=(x, y), seam=InlineServerSeam())
        assert isinstance(core.rule, RoundServer)
        timed = core.rule.rounds = TimedRounds(core)
        cost = FixedStepCost(0.001, 16)
        workers = [Worker(rank, LocalTransport(core), tiny_model(), batches_of(x, y, rank),
                          "bsp", protocol_params=params, lr=0.1, batch_size=16,
                          seam=VirtualWorkerSeam(StepChange(d, d * scale, at), cost))
                   for rank, d in enumerate(before)]
        await asyncio.gather(*(w.run() for w in workers))
        await core.stop()
        await core.close()
        return timed

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


class TimedRounds(deque[RoundRecord]):
    """A rule's `rounds`, with the run time each closed."""

    def __init__(self, core: ServerCore) -> None:
        super().__init__()
        self.core = core
        self.closed_at: list[float] = []

    def append(self, record: RoundRecord) -> None:
        self.closed_at.append(self.core.store.now())
        super().append(record)


@pytest.mark.parametrize("policy", [{"deadline_quantile": 0.75}, {"deadline_mad_k": 2.0}])
@pytest.mark.parametrize("scale", [4.0, 0.25])
def test_the_adaptive_deadline_follows_a_step_change_within_a_few_rounds(
        policy: dict[str, float], scale: float) -> None:
    params = BspParams(deadline_window=4, **policy)
    rounds = run_step_change(params, [0.01, 0.02, 0.03, 0.05], scale, at=3.0, time_s=6.0)
    deadlines = [r.deadline_s for r in rounds]
    assert deadlines[:2] == [None, None]  # too few rounds known: no deadline yet
    before = [d for d, t in zip(deadlines, rounds.closed_at, strict=True)
              if 2.0 < t < 3.0 and d is not None]
    level = sum(before) / len(before)
    assert max(before) < 1.5 * level and min(before) > level / 1.5  # settled
    assert 0.01 < level < 0.1  # about the spread of the workers' step times
    after = [d for d, t in zip(deadlines, rounds.closed_at, strict=True) if t >= 3.0]
    assert after and all(d is not None for d in after)
    target = level * scale
    # from the 5th round after the change on, it is near the new level (late reports of
    # the change's rounds overshoot it at most 2.5 x for a few rounds), and it settles there
    assert all(0.5 * target <= d <= 2.5 * target for d in after[4:] if d is not None), after
    assert after[-1] == pytest.approx(target, rel=0.1), after
