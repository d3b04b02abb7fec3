"""FedOpt: FedAdam, FedYogi and FedAdagrad as the server step of the protocols that
aggregate deltas, checked against torch.optim fed the negated aggregated delta, and
against the paper's rule written out here."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncsync.protocols.base import Push, ServerRule, Unacceptable
from asyncsync.protocols.diloco import DilocoParams, DilocoServer
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.protocols.fedbuff import FedBuffParams, FedBuffServer
from asyncsync.protocols.fednova import FedNovaParams, FedNovaServer
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer
from asyncsync.protocols.server_optim import ServerAdaptive, ServerSgd
from asyncsync.protocols.testing import FakeStore
from tests.helpers import run_local

SIZE = 7


def store_of(workers: int, num_params: int | None = None, seed: int = 0) -> FakeStore:
    """A float64 store whose `workers` ranks are all in the run."""
    gen = torch.Generator().manual_seed(seed)
    store = FakeStore(torch.randn(SIZE, dtype=torch.float64, generator=gen), workers,
                      lr=0.1, num_params=num_params)
    return store


def deltas(count: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(SIZE, dtype=torch.float64, generator=gen) for _ in range(count)]


async def push_round(rule: ServerRule, round_deltas: list[torch.Tensor],
                     samples: list[int] | None = None, steps: int = 4) -> None:
    """Worker i pushes ``round_deltas[i]`` based on the current version."""
    base = rule.store.version
    for worker, delta in enumerate(round_deltas):
        count = 64 if samples is None else samples[worker]
        await rule.on_push(Push(worker, base, "delta", delta.clone(), steps, count))


def torch_reference(optimizer: str, w0: torch.Tensor, lr: float,
                    ) -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    """A parameter at `w0` and the torch optimizer FedOpt's step must match."""
    param = torch.nn.Parameter(w0.clone())
    if optimizer == "adam":
        return param, torch.optim.Adam([param], lr=lr, betas=(0.9, 0.99), eps=1e-3)
    return param, torch.optim.Adagrad([param], lr=lr, eps=1e-3)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
async def test_local_sgd_server_step_is_torch_optim_on_the_negated_mean_delta(
        optimizer: str) -> None:
    # FedAdagrad is torch's Adagrad when it keeps no momentum (beta1 = 0)
    beta1 = 0.9 if optimizer == "adam" else 0.0
    params = LocalSgdParams(server_optimizer=optimizer, server_lr=0.05, beta1=beta1)
    store = store_of(3)
    rule = LocalSgdServer(params, store)
    reference, torch_optimizer = torch_reference(optimizer, store.w, 0.05)
    for round_number in range(5):
        round_deltas = deltas(3, seed=round_number)
        await push_round(rule, round_deltas)
        reference.grad = -(round_deltas[0] + round_deltas[1] + round_deltas[2]) / 3
        torch_optimizer.step()
        assert store.version == round_number + 1
        assert torch.allclose(store.w, reference.detach(), rtol=1e-12, atol=1e-12)


async def test_the_default_learning_rates_are_fedopts() -> None:
    # sgd: lr 1, plain averaging; the adaptive ones: 1e-2 (one Adam step moves each
    # coordinate by about lr, whatever the size of the delta)
    store = store_of(2)
    rule = LocalSgdServer(LocalSgdParams(server_optimizer="adam"), store)
    w0 = store.w
    await push_round(rule, [torch.full((SIZE,), 3.0, dtype=torch.float64)] * 2)
    assert torch.allclose(store.w - w0, torch.full((SIZE,), 1e-2, dtype=torch.float64),
                          rtol=1e-3)
    store = store_of(2)
    rule = LocalSgdServer(LocalSgdParams(), store)
    w0 = store.w
    await push_round(rule, [torch.full((SIZE,), 3.0, dtype=torch.float64),
                            torch.full((SIZE,), 1.0, dtype=torch.float64)])
    assert torch.equal(store.w, w0 + 2.0)


def adaptive_by_hand(kind: str, w: torch.Tensor, gradients: list[torch.Tensor], lr: float,
                     beta1: float, beta2: float, tau: float, corrected: bool) -> torch.Tensor:
    """Reddi et al.'s Algorithm 2 (optionally with Adam's bias correction), from zero
    moments, on pseudo-gradients `gradients`."""
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(gradients, start=1):
        m = beta1 * m + (1 - beta1) * g
        if kind == "adam":
            v = beta2 * v + (1 - beta2) * g**2
        elif kind == "yogi":
            v = v - (1 - beta2) * g**2 * torch.sign(v - g**2)
        else:
            v = v + g**2
        m_hat, v_hat = m, v
        if corrected:
            m_hat = m / (1 - beta1**t)
            v_hat = v if kind == "adagrad" else v / (1 - beta2**t)
        w = w - lr * m_hat / (v_hat.sqrt() + tau)
    return w


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
@pytest.mark.parametrize("corrected", [True, False])
def test_each_adaptive_optimizer_follows_the_papers_rule(kind: str, corrected: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(SIZE, dtype=torch.float64, generator=gen)
    # gradients that shrink, so that yogi's sign(v - g^2) takes both values
    gradients = [torch.randn(SIZE, dtype=torch.float64, generator=gen) * 2.0**-k
                 for k in range(6)]
    optimizer = ServerAdaptive(kind, 0.1, 0.8, 0.9, 1e-2, bias_correction=corrected)
    w = w0
    for g in gradients:
        w = optimizer.step(w, g)
    expected = adaptive_by_hand(kind, w0, gradients, 0.1, 0.8, 0.9, 1e-2, corrected)
    assert torch.allclose(w, expected, rtol=1e-12, atol=1e-14)
    assert int(optimizer.state["step"]) == 6


def test_yogi_and_adam_differ_once_the_gradient_shrinks() -> None:
    """Yogi's v decays additively, Adam's multiplicatively: the rules are not the same."""
    gradients = [torch.full((2,), 10.0, dtype=torch.float64),
                 torch.full((2,), 0.1, dtype=torch.float64)]
    second = {}
    for kind in ("adam", "yogi"):
        optimizer = ServerAdaptive(kind, 0.1, 0.0, 0.5, 1e-3)
        w = torch.zeros(2, dtype=torch.float64)
        for g in gradients:
            w = optimizer.step(w, g)
        second[kind] = optimizer.state["v"][0].item()
    # adam: v = 0.5 * 50 + 0.5 * 0.01; yogi: v = 50 - 0.5 * 0.01
    assert second["adam"] == pytest.approx(25.005)
    assert second["yogi"] == pytest.approx(49.995)


def test_a_step_that_would_be_non_finite_is_refused_and_changes_nothing() -> None:
    optimizer = ServerAdaptive("adam", 0.01, 0.9, 0.99, 1e-3)
    w = torch.zeros(3)
    w = optimizer.step(w, torch.tensor([1.0, -2.0, 0.5]))
    state = {key: value.clone() for key, value in optimizer.state.items()}
    # 1e20 squared overflows float32: the second moment would become inf
    huge = torch.tensor([1e20, 0.0, 0.0])
    with pytest.raises(Unacceptable, match="non-finite"):
        optimizer.step(w, huge)
    assert optimizer.refused == 1
    assert all(torch.equal(optimizer.state[key], state[key]) for key in state)
    after = optimizer.step(w, torch.tensor([1.0, -2.0, 0.5]))
    assert torch.isfinite(after).all() and not torch.equal(after, w)
    assert int(optimizer.state["step"]) == 2
    sgd = ServerSgd(1.0, momentum=0.9)
    assert sgd.step(w, torch.tensor([3e38, 3e38, 0.0])) is not w
    momentum = sgd.state["momentum"].clone()
    with pytest.raises(Unacceptable):  # the momentum would overflow
        sgd.step(w, torch.tensor([3e38, 3e38, 0.0]))
    assert sgd.refused == 1 and torch.equal(sgd.state["momentum"], momentum)


async def test_buffers_take_the_mean_delta_not_the_adaptive_step() -> None:
    store = store_of(2, num_params=5)
    rule = LocalSgdServer(LocalSgdParams(server_optimizer="yogi"), store)
    w0 = store.w
    round_deltas = deltas(2, seed=9)
    await push_round(rule, round_deltas)
    mean = (round_deltas[0] + round_deltas[1]) / 2
    assert torch.allclose(store.w[5:], w0[5:] + mean[5:], rtol=1e-12)
    assert not torch.allclose(store.w[:5], w0[:5] + mean[:5])
    assert rule.optimizer.state["m"].shape == (5,)


async def test_fedavg_steps_on_the_sample_weighted_mean() -> None:
    store = store_of(3)
    rule = FedAvgServer(FedAvgParams(server_optimizer="adam", server_lr=0.05), store)
    reference, adam = torch_reference("adam", store.w, 0.05)
    for round_number in range(3):
        round_deltas = deltas(3, seed=20 + round_number)
        await push_round(rule, round_deltas, samples=[10, 30, 60])
        reference.grad = -(0.1 * round_deltas[0] + 0.3 * round_deltas[1]
                           + 0.6 * round_deltas[2])
        adam.step()
        assert torch.allclose(store.w, reference.detach(), rtol=1e-12, atol=1e-12)


async def test_fedbuff_steps_on_the_buffered_sum_over_k() -> None:
    store = store_of(2)
    params = FedBuffParams(buffer_size=3, staleness_fn="polynomial", a=1.0,
                           server_optimizer="adam", server_lr=0.05)
    rule = FedBuffServer(params, store)
    reference, adam = torch_reference("adam", store.w, 0.05)
    for round_number in range(3):
        buffered = deltas(3, seed=30 + round_number)
        base = store.version
        # the third delta is based on the version before: staleness 1, weight 1/2
        bases = [base, base, max(base - 1, 0)]
        for k, delta in enumerate(buffered):
            await rule.on_push(Push(k % 2, bases[k], "delta", delta.clone(), 4, 64))
        weights = [1.0, 1.0, 0.5 if base else 1.0]
        reference.grad = -sum(s * d for s, d in zip(weights, buffered, strict=True)) / 3
        adam.step()
        assert store.version == round_number + 1
        assert torch.allclose(store.w, reference.detach(), rtol=1e-12, atol=1e-12)


async def test_fednova_steps_on_the_normalized_aggregate() -> None:
    store = store_of(2)
    rule = FedNovaServer(FedNovaParams(server_optimizer="adagrad", server_lr=0.05, beta1=0.0),
                         store)
    reference, adagrad = torch_reference("adagrad", store.w, 0.05)
    for round_number in range(3):
        first, second = deltas(2, seed=40 + round_number)
        await rule.on_push(Push(0, store.version, "delta", first.clone(), 2, 32))
        await rule.on_push(Push(1, store.version, "delta", second.clone(), 6, 96))
        # tau_eff = 4: 4 * (first / 2 + second / 6) / 2
        reference.grad = -(first + second / 3)
        adagrad.step()
        assert torch.allclose(store.w, reference.detach(), rtol=1e-12, atol=1e-12)


async def test_diloco_outer_step_goes_through_the_same_seam() -> None:
    store = store_of(2)
    rule = DilocoServer(DilocoParams(outer_optimizer="adam", outer_lr=0.05), store)
    reference, adam = torch_reference("adam", store.w, 0.05)
    for round_number in range(3):
        round_deltas = deltas(2, seed=50 + round_number)
        await push_round(rule, round_deltas)
        reference.grad = -(round_deltas[0] + round_deltas[1]) / 2
        adam.step()
        assert torch.allclose(store.w, reference.detach(), rtol=1e-12, atol=1e-12)
    assert sorted(rule.state_dict()) == ["outer.0.m", "outer.0.step", "outer.0.v"]


async def test_the_optimizer_state_survives_a_checkpoint() -> None:
    params = LocalSgdParams(server_optimizer="yogi", server_lr=0.1)
    first = LocalSgdServer(params, store_of(2))
    for round_number in range(2):
        await push_round(first, deltas(2, seed=60 + round_number))
    state = first.state_dict()
    assert sorted(state) == ["server.m", "server.step", "server.v"]
    resumed = LocalSgdServer(params, store_of(2))
    resumed.store.w = first.store.w.clone()
    resumed.load_state_dict({key: value.clone() for key, value in state.items()})
    fresh = LocalSgdServer(params, store_of(2))
    fresh.store.w = first.store.w.clone()
    for rule in (first, resumed, fresh):
        await push_round(rule, deltas(2, seed=70))
    assert torch.equal(first.store.w, resumed.store.w)
    assert not torch.allclose(first.store.w, fresh.store.w)  # the state mattered
    with pytest.raises(ValueError, match="shape"):
        resumed.load_state_dict({**state, "server.m": torch.zeros(3)})


def test_bad_optimizer_parameters_name_the_parameter() -> None:
    cases: list[tuple[str, Any]] = [("server_optimizer", "rmsprop"), ("server_lr", 0.0),
                                    ("beta1", 1.0), ("beta2", -0.1), ("tau", 0.0)]
    for key, value in cases:
        with pytest.raises(ValueError, match=rf"^{key}:"):
            FedAvgParams(**{key: value})
    with pytest.raises(ValueError, match=r"^outer_optimizer:"):
        DilocoParams(outer_optimizer="lamb")


async def test_fedavg_with_fedadam_trains() -> None:
    params = FedAvgParams(local_steps=4, server_optimizer="adam", server_lr=0.01)
    core, _ = await run_local("fedavg", [0.0, 0.001, 0.002], params=params, time_s=2.0)
    assert core.store.version >= 20
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < 0.6 * core.evals[0].loss
