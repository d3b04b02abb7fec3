"""DS-Sync: each group average involves exactly its members; over iterations every worker's
model mixes every other's; no global barrier; a run over HTTP."""

from __future__ import annotations

import asyncio
import itertools
from typing import cast

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import OutOfStep, Pull, Push, Refused
from asyncsync.protocols.dssync import DsSyncParams, DsSyncServer, Group, partition
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_http, run_local


def mixing(groups: list[Group], workers: int) -> torch.Tensor:
    """The averaging matrix of one iteration: row i averages i's group."""
    matrix = torch.zeros(workers, workers, dtype=torch.float64)
    for group in groups:
        for i, j in itertools.product(group, group):
            matrix[i, j] = 1 / len(group)
    return matrix


@pytest.mark.parametrize(("workers", "size", "within"), [
    (4, 2, 2), (8, 2, 10), (6, 3, 10), (7, 2, 10), (5, 2, 10), (3, 2, 10)])
def test_partitions_cover_the_workers_and_connect_every_pair(workers: int, size: int,
                                                             within: int) -> None:
    product = torch.eye(workers, dtype=torch.float64)
    for iteration in range(within):
        groups = partition(iteration, workers, size, seed=0)
        assert groups == partition(iteration, workers, size, seed=0)  # same on every node
        assert sorted(itertools.chain(*groups)) == list(range(workers))
        assert all(len(g) == size for g in groups[: workers // size])
        product = mixing(groups, workers) @ product
    # every worker's model now contains a share of every other worker's
    assert bool((product > 0).all()), product
    assert len({tuple(partition(i, workers, size, 0)) for i in range(within)}) > 1


def test_four_workers_alternate_as_the_official_code() -> None:
    assert [partition(i, 4, 2, seed=5) for i in range(3)] == [
        [(0, 1), (2, 3)], [(0, 3), (1, 2)], [(0, 1), (2, 3)]]


async def test_each_group_average_involves_exactly_its_members() -> None:
    store = ParameterStore(torch.zeros(3), 4, FlatSGD(0.1))
    store.live.update(range(4))
    rule = DsSyncServer(DsSyncParams(), store)
    models = [torch.full((3,), float(2 ** i)) for i in range(4)]  # 1, 2, 4, 8

    with pytest.raises(Refused) as early:
        await rule.on_pull(Pull(0, 0, {"iteration": 0}))
    assert isinstance(early.value, OutOfStep)
    with pytest.raises(Refused) as wrong:
        await rule.on_push(Push(0, 0, "model", models[0], 0, 0, {"iteration": 1}))
    assert isinstance(wrong.value, OutOfStep) and store.version == 0

    # iteration 0: {0,1} {2,3}. Worker 0 waits for worker 1 only, not for 2 or 3.
    await rule.on_push(Push(0, 0, "model", models[0], 0, 0, {"iteration": 0}))
    pull0 = asyncio.create_task(rule.on_pull(Pull(0, 0, {"iteration": 0})))
    await rule.on_push(Push(2, 0, "model", models[2], 0, 0, {"iteration": 0}))
    await asyncio.sleep(0.02)
    assert not pull0.done()
    await rule.on_push(Push(1, 0, "model", models[1], 0, 0, {"iteration": 0}))
    reply0 = await pull0
    assert reply0.vector is not None and torch.equal(reply0.vector, torch.full((3,), 1.5))
    assert reply0.meta["group"] == [0, 1]
    await rule.on_push(Push(3, 0, "model", models[3], 0, 0, {"iteration": 0}))
    reply3 = await rule.on_pull(Pull(3, 0, {"iteration": 0}))
    assert reply3.vector is not None and torch.equal(reply3.vector, torch.full((3,), 6.0))
    # the global vector, which is evaluated, is the mean of the workers' latest models
    assert torch.equal(rule.eval_vector(), torch.full((3,), 3.75))

    # iteration 1: {0,3} {1,2}
    for worker in range(4):
        await rule.on_push(Push(worker, 1, "model", models[worker] * 10, 1, 16,
                                {"iteration": 1}))
    for worker, mean in {0: 45.0, 3: 45.0, 1: 30.0, 2: 30.0}.items():
        reply = await rule.on_pull(Pull(worker, 1, {"iteration": 1}))
        assert reply.vector is not None and torch.equal(reply.vector, torch.full((3,), mean))
    assert torch.allclose(rule.eval_vector(), torch.full((3,), 37.5))

    members = [sorted(w for w, _ in c.contributions) for c in store.commits]
    assert members == [[0, 1], [2, 3], [1, 2], [0, 3]]
    assert [(a.iteration, a.members) for a in rule.averages] == [
        (0, (0, 1)), (0, (2, 3)), (1, (1, 2)), (1, (0, 3))]
    assert rule.averages[0].behind == (3,)  # {0,1} finished before worker 3 even pushed


async def test_groups_advance_without_a_global_barrier() -> None:
    core, finals = await run_local("dssync", [0.0, 0.0, 0.0, 0.02], max_steps=30)
    rule = cast(DsSyncServer, core.rule)
    assert len(rule.averages) >= 40
    for average in rule.averages:
        assert average.members in partition(average.iteration, 4, 2, 0)
    # a group of iteration t completed while a worker outside it had not yet even pushed
    # for iteration t: no barrier spans all the workers
    ahead = [a for a in rule.averages if a.behind]
    assert len(ahead) >= 10, rule.averages
    assert all(set(a.behind).isdisjoint(a.members) for a in ahead)
    # every commit is one group: exactly its two members
    assert all(len(c.contributions) == 2 for c in core.store.commits)
    assert all(27 <= f["steps"] <= 31 for f in finals)


async def test_dssync_over_http() -> None:
    core, finals = await run_http("dssync", workers=4, time_s=1.0)
    assert core.store.version >= 4
    assert all(f["steps"] >= 1 and f["bytes_up"] > 0 for f in finals)
    assert all(len(c.contributions) == 2 for c in core.store.commits)
    assert core.evals[-1].loss < core.evals[0].loss


@pytest.mark.parametrize(("field_name", "value"), [("group_size", 1), ("seed", -1)])
def test_bad_parameters_name_the_parameter(field_name: str, value: int) -> None:
    with pytest.raises(ValueError, match=field_name):
        DsSyncParams(**{field_name: value})
