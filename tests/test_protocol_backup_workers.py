"""BSP with backup workers and a deadline: rounds close without the slowest members, late
gradients are dropped and counted, and their workers carry on from the newest model."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.compute import InlineServerSeam
from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import OutOfStep, Pull, Push, Refused
from asyncsync.protocols.bsp import BspParams, BspServer
from asyncsync.protocols.rounds import ON_TIME_S
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.training.optim import FlatSGD
from tests.helpers import ranks, run_local

T = TypeVar("T")
LR = 0.1


def in_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    """Run `main` on a virtual-time loop (deadlines then cost no real time)."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def bsp_rule(workers: int, params: BspParams, w0: torch.Tensor,
             optimizer: FlatSGD | None = None) -> tuple[BspServer, ParameterStore]:
    """A bsp rule over a store whose `workers` ranks are live (math inline)."""
    store = ParameterStore(w0.clone(), workers, optimizer or FlatSGD(LR), seam=InlineServerSeam())
    store.live.update(range(workers))
    return BspServer(params, store), store


def gradient(worker: int, version: int, vector: torch.Tensor) -> Push:
    return Push(worker, version, "gradient", vector.clone(), 1, 16)


async def pulled_version(rule: BspServer, worker: int, base: int) -> int:
    reply = await asyncio.wait_for(rule.on_pull(Pull(worker, base)), 5)
    assert reply.version is not None
    return reply.version


async def test_backup_workers_close_with_the_first_n_minus_b_and_drop_the_rest() -> None:
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(6, generator=gen)
    g = [torch.randn(6, generator=gen) for _ in range(4)]
    rule, store = bsp_rule(4, BspParams(backup_workers=1), w0)
    for worker in (2, 0):
        await rule.on_push(gradient(worker, 0, g[worker]))
    assert store.version == 0
    await rule.on_push(gradient(3, 0, g[3]))  # the third of four: the round closes
    assert store.version == 1
    assert torch.allclose(store.w, w0 - LR * (g[2] + g[0] + g[3]) / 3)
    assert rule.rounds[-1].missing == {1} and ranks(store.commits[-1]) == {0, 2, 3}

    # the backup's gradient arrives late: dropped, counted, the model untouched, and its
    # pull answered at once with the newest version
    w1 = store.w
    assert (await rule.on_push(gradient(1, 0, g[1])))["late"] is True
    assert rule.late == {1: 1} and store.version == 1 and store.w is w1
    assert await pulled_version(rule, 1, 0) == 1
    # and it takes part in the next round as any member
    for worker in (1, 0, 2):
        await rule.on_push(gradient(worker, 1, g[worker]))
    assert store.version == 2 and ranks(store.commits[-1]) == {0, 1, 2}


async def test_no_backups_and_no_deadline_is_plain_synchronous_sgd() -> None:
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(8, generator=gen)
    rule, store = bsp_rule(3, BspParams(), w0, FlatSGD(LR, momentum=0.9))
    reference = torch.nn.Parameter(w0.clone())
    sgd = torch.optim.SGD([reference], lr=LR, momentum=0.9)
    for version in range(4):
        grads = [torch.randn(8, generator=gen) for _ in range(3)]
        for worker in (2, 0):
            await rule.on_push(gradient(worker, version, grads[worker]))
        assert store.version == version  # every worker's gradient is awaited
        await rule.on_push(gradient(1, version, grads[1]))
        reference.grad = (grads[0] + grads[1] + grads[2]) / 3
        sgd.step()
        assert torch.allclose(store.w, reference.detach(), atol=1e-6)
    # a push from an older version is out of step, as in plain bsp (nothing is late)
    with pytest.raises(Refused) as err:
        await rule.on_push(gradient(0, 2, grads[0]))
    assert isinstance(err.value, OutOfStep) and not rule.late


def test_a_deadline_closes_the_round_with_what_arrived() -> None:
    gen = torch.Generator().manual_seed(7)
    w0 = torch.randn(6, generator=gen)
    g = [torch.randn(6, generator=gen) for _ in range(3)]

    async def main() -> list[tuple[float, int]]:
        rule, store = bsp_rule(3, BspParams(deadline_s=0.5), w0)
        seen: list[tuple[float, int]] = []  # (time, version) at each probe

        async def at(t: float) -> None:
            await asyncio.sleep(t - store.now())

        await at(1.0)
        await rule.on_push(gradient(0, 0, g[0]))  # the round's first push: deadline 1.5
        pull = asyncio.create_task(rule.on_pull(Pull(0, 0)))
        await at(1.2)
        await rule.on_push(gradient(1, 0, g[1]))
        await at(1.49)
        seen.append((store.now(), store.version))
        reply = await pull
        seen.append((store.now(), store.version))
        assert reply.version == 1 and rule.rounds[-1].missing == {2}
        assert torch.allclose(store.w, w0 - LR * (g[0] + g[1]) / 2)
        # worker 2's gradient is late: dropped and counted; it pulls the newest model
        await at(2.0)
        assert (await rule.on_push(gradient(2, 0, g[2])))["late"] is True
        assert rule.late == {2: 1} and store.version == 1
        assert await pulled_version(rule, 2, 0) == 1
        # the next round: its deadline counts from its own first push (at 3.0)
        await at(3.0)
        await rule.on_push(gradient(2, 1, g[2]))
        await at(3.4)
        await rule.on_push(gradient(0, 1, g[0]))
        await asyncio.wait_for(rule.on_pull(Pull(2, 1)), 5)
        seen.append((store.now(), store.version))
        assert rule.rounds[-1].missing == {1}
        return seen

    seen = in_virtual_time(main)
    assert [version for _, version in seen] == [0, 1, 2]
    assert [t for t, _ in seen] == pytest.approx([1.49, 1.5, 3.5])


def test_a_deadline_restarts_when_the_only_pusher_rejoins() -> None:
    async def main() -> tuple[float, int]:
        rule, store = bsp_rule(3, BspParams(deadline_s=0.5), torch.zeros(4))
        await rule.on_push(gradient(0, 0, torch.ones(4)))
        await asyncio.sleep(0.2)
        store.live.discard(0)
        await rule.on_leave(0)  # its gradient arrived: it still counts
        store.live.add(0)
        await rule.on_join(0)  # back: its gradient is withdrawn (it pushes anew): none left
        await asyncio.sleep(0.2)
        await rule.on_push(gradient(1, 0, torch.ones(4)))  # a new first push: deadline 0.9
        await asyncio.sleep(0.2)
        assert store.version == 0  # the withdrawn push's deadline (0.5) did not fire
        await asyncio.wait_for(rule.on_pull(Pull(1, 0)), 5)
        return store.now(), store.version

    closed_at, version = in_virtual_time(main)
    assert version == 1 and closed_at == pytest.approx(0.9, abs=2 * ON_TIME_S)


async def test_rounds_do_not_wait_for_a_very_slow_backup_worker() -> None:
    core, finals = await run_local("bsp", [0.0, 0.002, 0.05],
                                   params=BspParams(backup_workers=1), max_steps=100)
    rule = core.rule
    assert isinstance(rule, BspServer)
    fast, _, slow = finals
    assert fast["steps"] == 100 and core.store.version >= 99
    # every version was made from the two fast workers' gradients, all fresh
    assert all(ranks(c) == {0, 1} for c in core.store.commits)
    assert all(r.missing == {2} for r in rule.rounds)
    assert core.store.staleness.maximum == 0
    # the slow worker's gradients were dropped and counted, and it carried on each time
    # from the newest model (no refusal, no rejoin)
    assert slow["steps"] >= 4 and rule.late[2] >= slow["steps"] - 1
    assert core.workers[2].joined_at == 0
    # the fast workers never waited for it: only for each other, a step at most
    assert core.store.held_s.get(0, 0.0) <= 100 * 0.0021
    # the same run without a backup waits for the slow worker at every version
    plain, _ = await run_local("bsp", [0.0, 0.002, 0.05], max_steps=20)
    assert plain.store.held_s[0] > 20 * 0.04


async def test_a_deadline_run_drops_the_straggler_and_trains() -> None:
    core, finals = await run_local("bsp", [0.0, 0.002, 0.05],
                                   params=BspParams(deadline_s=0.01), time_s=3.0)
    rule = core.rule
    assert isinstance(rule, BspServer)
    assert core.store.version >= 100
    assert all(ranks(c) <= {0, 1} for c in core.store.commits)
    # each round waited the deadline for the straggler, then closed with the fast two
    assert rule.late[2] >= finals[2]["steps"] - 1 >= 10
    assert core.store.held_s[0] == pytest.approx(0.01 * core.store.version, rel=0.1)
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < core.evals[0].loss


def test_bad_parameters_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^backup_workers:"):
        BspParams(backup_workers=-1)
    with pytest.raises(ValueError, match=r"^deadline_s:"):
        BspParams(deadline_s=-0.5)
    with pytest.raises(ConfigError, match=r"^protocol\.deadline_s:"):
        from_mapping(BspParams, {"deadline_s": float("inf")}, "protocol")
    with pytest.raises(ValueError, match=r"^backup_workers: must be < workers \(3\)"):
        bsp_rule(3, BspParams(backup_workers=3), torch.zeros(2))


def test_params_come_from_a_recipe_table() -> None:
    params = from_mapping(BspParams, {"backup_workers": 1, "deadline_s": 2}, "protocol")
    assert params == BspParams(backup_workers=1, deadline_s=2.0)
