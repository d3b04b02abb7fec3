"""FedNova: deltas normalized by their step counts; unequal local work does not pull the
model toward the fast workers' optima, as FedAvg's does; equal step counts are FedAvg."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Push, Refused, ServerRule, Unacceptable
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.fednova import FedNovaParams, FedNovaServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_local


def store_of(w0: torch.Tensor, workers: int, num_params: int | None = None) -> ParameterStore:
    store = ParameterStore(w0.clone(), workers, FlatSGD(0.1), num_params=num_params)
    store.live.update(range(workers))
    return store


async def test_each_delta_is_divided_by_its_steps_and_rescaled_by_tau_eff() -> None:
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(10, dtype=torch.float64, generator=gen)
    store = store_of(w0, 3, num_params=8)
    rule = FedNovaServer(FedNovaParams(), store)
    deltas = [torch.randn(10, dtype=torch.float64, generator=gen) for _ in range(3)]
    for worker, steps in enumerate([2, 4, 10]):
        await rule.on_push(Push(worker, 0, "delta", deltas[worker].clone(), steps, 32 * steps))
    assert store.version == 1
    tau_eff = (2 + 4 + 10) / 3
    expected = w0 + tau_eff * (deltas[0] / 2 + deltas[1] / 4 + deltas[2] / 10) / 3
    assert torch.allclose(store.w[:8], expected[:8], rtol=1e-12)
    # the two buffer slots take the plain mean of the deltas
    assert torch.allclose(store.w[8:], (w0 + sum(deltas) / 3)[8:], rtol=1e-12)
    with pytest.raises(Refused) as err:
        await rule.on_push(Push(0, 1, "delta", deltas[0].clone(), 0, 32))
    assert isinstance(err.value, Unacceptable)


async def test_equal_step_counts_give_fedavg() -> None:
    gen = torch.Generator().manual_seed(6)
    w0 = torch.randn(10, dtype=torch.float64, generator=gen)
    deltas = [torch.randn(10, dtype=torch.float64, generator=gen) for _ in range(3)]
    # FedAvg by hand: w + sum_i (n_i / n) delta_i, here with n_i = 5 steps x 16 samples
    expected = w0 + (80 * deltas[0] + 80 * deltas[1] + 80 * deltas[2]) / 240
    for rule in (FedNovaServer(FedNovaParams(), store_of(w0, 3)),
                 FedAvgServer(FedAvgParams(), store_of(w0, 3))):
        for worker, delta in enumerate(deltas):
            await rule.on_push(Push(worker, 0, "delta", delta.clone(), 5, 80))
        assert torch.allclose(rule.store.w, expected, rtol=1e-12)


async def settle(rule: ServerRule, steps: list[int], optima: torch.Tensor, lr: float,
                 rounds: int) -> torch.Tensor:
    """Rounds in which worker i runs ``steps[i]`` gradient steps on its own quadratic
    ``1/2 ||x - optima[i]||^2`` (by hand) and pushes the delta; the final global model."""
    for _ in range(rounds):
        base, x = rule.store.version, rule.store.w
        for worker, (count, optimum) in enumerate(zip(steps, optima, strict=True)):
            y = x.clone()
            for _ in range(count):
                y -= lr * (y - optimum)
            await rule.on_push(Push(worker, base, "delta", y - x, count, 16 * count))
    return rule.store.w


async def test_unequal_local_work_does_not_bias_the_model_toward_fast_workers() -> None:
    # the global objective, the mean of the three quadratics, is minimal at the mean optimum;
    # worker 2 is the fastest (16 local steps per round), worker 0 the slowest (1)
    optima = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    best = optima.mean(dim=0)
    spread = float((optima[2] - best).norm())
    steps, lr = [1, 4, 16], 0.01
    nova = await settle(FedNovaServer(FedNovaParams(), store_of(torch.zeros(2), 3)),
                        steps, optima, lr, rounds=600)
    fedavg = await settle(FedAvgServer(FedAvgParams(), store_of(torch.zeros(2), 3)),
                          steps, optima, lr, rounds=600)
    assert float((nova - best).norm()) < 0.05 * spread
    # FedAvg weights the deltas by samples, i.e. by local steps: it settles near the fast
    # worker's optimum
    assert float((fedavg - optima[2]).norm()) < 0.25 * spread
    assert float((fedavg - best).norm()) > 0.75 * spread


async def test_a_time_budget_gives_fast_workers_more_steps_and_nobody_waits_long() -> None:
    # steps take 1 ms (worker 0) and 4 ms (worker 1); a 20 ms budget holds 20 and 5 of them
    core, _ = await run_local("fednova", [0.0, 0.003], params=FedNovaParams(budget_s=0.02),
                              time_s=1.0)
    assert isinstance(core.rule, FedNovaServer)
    rounds = list(core.rule.rounds)
    assert len(rounds) >= 40
    for record in rounds:
        assert 19 <= record.steps[0] <= 20 and 4 <= record.steps[1] <= 5, record
    # both finish their budget at about the same time: little waiting at the barrier
    assert all(blocked < 0.1 for blocked in core.store.held_s.values()), (
        core.store.held_s)


async def test_fednova_trains() -> None:
    core, _ = await run_local("fednova", [0.0, 0.002, 0.006],
                              params=FedNovaParams(budget_s=0.01), time_s=2.0)
    assert core.store.version >= 20
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < 0.6 * core.evals[0].loss


def test_bad_params_name_the_parameter() -> None:
    cases: list[tuple[str, Any]] = [("local_steps", 0), ("budget_s", -1.0),
                                    ("server_optimizer", "sgdm")]
    for key, value in cases:
        with pytest.raises(ValueError, match=rf"^{key}:"):
            FedNovaParams(**{key: value})
