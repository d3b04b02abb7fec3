"""SCAFFOLD: on quadratics whose optima and curvatures differ per worker it reaches the
global optimum, where FedAvg settles at a point biased by client drift; with one local step
it is gradient descent on the mean objective; the control variates' bookkeeping.

`run_quadratic` runs a protocol through the engine (real worker loops, virtual time) on
such quadratics: a "model" that is a point x, worker i's loss
``1/2 sum_j a_ij (x_j - o_ij)^2``, deterministic gradients.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.compute import InlineServerSeam, VirtualWorkerSeam
from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import FixedStepCost, StepDelay
from asyncsync.protocols.base import BadRequest, OutOfStep, Pull, Push, Refused
from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.scaffold import ScaffoldParams, ScaffoldServer
from asyncsync.training.optim import FlatSGD
from asyncsync.training.trainer import BatchSource, LossFn, Trainer
from asyncsync.transport.local import LocalTransport
from tests.helpers import ranks, run_local, run_workers

# two workers, two coordinates: each worker is steep where the other is flat
CURVATURES = torch.tensor([[1.0, 0.2], [0.2, 1.0]])
OPTIMA = torch.tensor([[0.0, 2.0], [4.0, -2.0]])
BEST = (CURVATURES * OPTIMA).sum(dim=0) / CURVATURES.sum(dim=0)
"""The minimum of the mean objective, coordinate by coordinate."""


class Point(nn.Module):
    """A model that is just a point: it outputs its parameter for every input."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(dims))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.x.expand(len(inputs), -1)


def quadratic(curvature: torch.Tensor) -> LossFn:
    def loss(output: torch.Tensor, optimum: torch.Tensor) -> torch.Tensor:
        return 0.5 * (curvature * (output - optimum) ** 2).sum(dim=1).mean()

    return loss


def towards(optimum: torch.Tensor) -> BatchSource:
    def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(size, 1), optimum.expand(size, -1)

    return batch


def run_quadratic(protocol: str, params: Any, lr: float, steps: int) -> torch.Tensor:
    """The global model after each worker ran `steps` local steps (in virtual time)."""
    dims = OPTIMA.shape[1]

    async def run() -> torch.Tensor:
        core = build_core(Point(dims), protocol, len(OPTIMA), ServerSettings(lr=lr),
                          protocol_params=params, seam=InlineServerSeam())
        workers = [Worker(rank, LocalTransport(core), Point(dims), towards(OPTIMA[rank]),
                          protocol, protocol_params=params, lr=lr, batch_size=1,
                          loss_fn=quadratic(CURVATURES[rank]), max_steps=steps, device="cpu",
                          seam=VirtualWorkerSeam(StepDelay(0.0), FixedStepCost(0.001, 1)))
                   for rank in range(len(OPTIMA))]
        await run_workers(core, workers)
        return core.store.w.clone()

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


async def test_scaffold_reaches_the_optimum_where_fedavg_drifts() -> None:
    lr, local = 0.1, 10
    scaffold = await asyncio.to_thread(run_quadratic, "scaffold",
                                       ScaffoldParams(local_steps=local), lr, 60 * local)
    fedavg = await asyncio.to_thread(run_quadratic, "fedavg",
                                     FedAvgParams(local_steps=local), lr, 60 * local)
    assert torch.allclose(scaffold, BEST, atol=1e-3), (scaffold, BEST)
    # FedAvg's fixed point, by hand: each worker's H steps of gradient descent move x by
    # (1 - (1 - lr a)^H) (o - x), and the mean of those moves vanishes at
    shrink = 1 - (1 - lr * CURVATURES) ** local
    drifted = (shrink * OPTIMA).sum(dim=0) / shrink.sum(dim=0)
    assert torch.allclose(fedavg, drifted, atol=1e-3), (fedavg, drifted)
    assert float((fedavg - BEST).norm()) > 0.25  # about 0.3: 300 times the tolerance above


async def test_one_local_step_is_gradient_descent_on_the_mean_objective() -> None:
    lr, rounds = 0.3, 12
    w = await asyncio.to_thread(run_quadratic, "scaffold", ScaffoldParams(local_steps=1),
                                lr, rounds)
    x = torch.zeros(2)
    for _ in range(rounds):
        x = x - lr * (CURVATURES * (x - OPTIMA)).mean(dim=0)
    assert torch.allclose(w, x, atol=1e-5), (w, x)


def test_a_corrected_local_step_descends_on_g_plus_the_correction() -> None:
    torch.manual_seed(2)
    model = nn.Linear(3, 1)
    reference = copy.deepcopy(model)
    x, y = torch.randn(6, 3), torch.randn(6, 1)
    trainer = Trainer(model, lambda size: (x, y), lr=0.1, loss_fn=F.mse_loss, device="cpu")
    correction = torch.randn(trainer.numel, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        trainer.local_step(6, correction=correction)
    # by hand: torch.optim.SGD on f(x) + correction . x, whose gradient is g + correction
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        sgd.zero_grad()
        linear = (reference.weight.flatten() @ correction[:3]
                  + reference.bias @ correction[3:])
        (F.mse_loss(reference(x), y) + linear).backward()
        sgd.step()
    expected = torch.cat([p.detach().flatten() for p in reference.parameters()])
    assert torch.allclose(trainer.flat, expected, atol=1e-6)


def scaffold_rule(workers: int) -> ScaffoldServer:
    store = ParameterStore(torch.zeros(3), workers, FlatSGD(0.1))
    store.live.update(range(workers))
    return ScaffoldServer(ScaffoldParams(), store)


def control(worker: int, version: int, value: float) -> Push:
    return Push(worker, version, "control", torch.full((3,), value), 8, 128)


def delta(worker: int, version: int, value: float) -> Push:
    return Push(worker, version, "delta", torch.full((3,), value), 8, 128)


async def refused(rule: ScaffoldServer, push: Push) -> str:
    with pytest.raises(Refused) as err:
        await rule.on_push(push)
    assert isinstance(err.value, OutOfStep)
    return err.value.reason


async def test_the_round_takes_both_pushes_and_c_becomes_their_mean() -> None:
    rule = scaffold_rule(2)
    assert "before its control variate" in await refused(rule, delta(0, 0, 1.0))
    assert "version" in await refused(rule, control(0, 1, 1.0))
    await rule.on_push(control(0, 0, 2.0))
    await rule.on_push(delta(0, 0, 1.0))
    assert "no control variate" in await refused(rule, control(0, 0, 5.0))  # after its delta
    await rule.on_push(control(1, 0, 6.0))
    await rule.on_push(delta(1, 0, 3.0))
    assert rule.store.version == 1
    assert torch.equal(rule.store.w, torch.full((3,), 2.0))  # x + mean delta
    assert torch.equal(rule.control, torch.full((3,), 4.0))  # mean of c_i+
    reply = await rule.on_pull(Pull(0, 1, {"part": "control"}))
    assert reply.vector is not None and torch.equal(reply.vector, torch.full((3,), 4.0))
    with pytest.raises(BadRequest, match="unknown part"):
        await rule.on_pull(Pull(0, 1, {"part": "gradient"}))
    assert torch.equal(rule.state_dict()["control"], torch.full((3,), 4.0))


async def test_a_lost_workers_control_variate_leaves_with_it_after_its_round() -> None:
    rule = scaffold_rule(3)
    for worker, value in [(0, 1.0), (2, 100.0)]:
        await rule.on_push(control(worker, 0, value))
        await rule.on_push(delta(worker, 0, value))
    await rule.on_push(control(1, 0, 3.0))
    rule.store.live.discard(2)
    await rule.on_leave(2)  # its delta and c_i+ arrived before it left: they count
    assert rule.store.version == 0
    await rule.on_push(delta(1, 0, 3.0))
    assert rule.store.version == 1 and ranks(rule.store.commits[-1]) == {0, 1, 2}
    assert torch.allclose(rule.control, torch.full((3,), 104 / 3))  # mean of 1, 100, 3
    assert torch.allclose(rule.store.w, torch.full((3,), 104 / 3))
    assert 2 not in rule.latest  # gone: its c_i is out of later rounds' mean
    # a rejoined worker takes part again; a control variate it pushed before is forgotten
    rule.store.live.add(2)
    await rule.on_join(2)
    assert 2 in rule.members()
    assert "before its control variate" in await refused(rule, delta(2, 1, 1.0))


async def test_scaffold_trains() -> None:
    core, _ = await run_local("scaffold", [0.0, 0.002, 0.006],
                              params=ScaffoldParams(local_steps=4), time_s=2.0)
    assert core.store.version >= 20
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < 0.6 * core.evals[0].loss
    assert all(len(c.contributions) == 3 for c in core.store.commits)


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^local_steps:"):
        ScaffoldParams(local_steps=0)
