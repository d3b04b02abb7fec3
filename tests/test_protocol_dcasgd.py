"""DC-ASGD: each gradient is compensated with lambda g*g*(w - w_pulled), w_pulled the model
of the version its worker pulled, taken from a bounded ring; lambda = 0 is ASP."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Pull, Push
from asyncsync.protocols.dcasgd import DcasgdParams, DcasgdServer
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.training.optim import FlatSGD
from tests.helpers import ranks, run_local

LR = 0.5
PARAMS = 5  # the vector's last slot is a buffer (a value, not a gradient)


def make_rule(params: DcasgdParams, seed: int = 0) -> tuple[DcasgdServer, ParameterStore,
                                                            torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    store = ParameterStore(torch.randn(6, dtype=torch.float64, generator=gen), 3, FlatSGD(LR),
                           num_params=PARAMS)
    return DcasgdServer(params, store), store, gen


async def pull(rule: DcasgdServer, worker: int) -> torch.Tensor:
    reply = await rule.on_pull(Pull(worker, 0))
    assert reply.vector is not None
    return reply.vector.clone()


def push(worker: int, base: int, g: torch.Tensor) -> Push:
    return Push(worker, base, "gradient", g.clone(), 1, 16)


async def test_compensation_uses_the_model_the_worker_pulled() -> None:
    lam = 0.7
    rule, store, gen = make_rule(DcasgdParams(lam=lam))
    g = [torch.randn(6, dtype=torch.float64, generator=gen) for _ in range(3)]
    w0a, w0b = await pull(rule, 0), await pull(rule, 1)  # both at version 0

    # worker 1 lands first: nothing moved since its pull, so nothing to compensate
    meta = await rule.on_push(push(1, 0, g[1]))
    w1 = w0b[:PARAMS] - LR * g[1][:PARAMS]
    assert meta["compensated"] is True
    assert torch.allclose(store.w[:PARAMS], w1)
    w1c = await pull(rule, 2)  # worker 2 pulls version 1

    # worker 0's gradient (from version 0) lands on version 1
    await rule.on_push(push(0, 0, g[0]))
    a = g[0][:PARAMS]
    compensated = a + lam * a * a * (w1 - w0a[:PARAMS])
    w2 = w1 - LR * compensated
    assert torch.allclose(store.w[:PARAMS], w2)
    assert torch.equal(store.w[PARAMS:], g[0][PARAMS:])  # the buffer is replaced as sent

    # worker 2's (from version 1) lands on version 2: its own pulled model, not version 0's
    await rule.on_push(push(2, 1, g[2]))
    c = g[2][:PARAMS]
    w3 = w2 - LR * (c + lam * c * c * (w2 - w1c[:PARAMS]))
    assert torch.allclose(store.w[:PARAMS], w3)
    assert rule.uncompensated == 0
    assert [ranks(commit) for commit in store.commits] == [{1}, {0}, {2}]


async def test_the_ring_is_bounded_and_older_pushes_are_plain_asp() -> None:
    rule, store, gen = make_rule(DcasgdParams(lam=0.5, ring=3))
    for version in range(10):
        await pull(rule, 0)
        await rule.on_push(push(0, version, torch.randn(6, dtype=torch.float64,
                                                        generator=gen)))
        assert len(rule.pulled) <= 3
    # kept: the versions a push at version 10 could be based on with staleness < 3
    assert sorted(rule.pulled) == [8, 9]
    # staleness 3 = ring: version 7 is gone, the gradient is applied as it is
    g = torch.randn(6, dtype=torch.float64, generator=gen)
    before = store.w
    meta = await rule.on_push(push(1, 7, g))
    assert meta["compensated"] is False and rule.uncompensated == 1
    assert torch.allclose(store.w[:PARAMS], before[:PARAMS] - LR * g[:PARAMS])
    # staleness 2 (version 9, now at 11) is still compensated
    assert (await rule.on_push(push(1, 9, g)))["compensated"] is True


async def test_lambda_zero_is_asynchronous_sgd() -> None:
    rule, store, gen = make_rule(DcasgdParams(lam=0.0))
    expected = store.w[:PARAMS].clone()
    for base in (0, 0, 1, 0, 3):  # staleness 0, 1, 1, 3, 1
        await pull(rule, 0)
        g = torch.randn(6, dtype=torch.float64, generator=gen)
        await rule.on_push(push(0, base, g))
        expected -= LR * g[:PARAMS]
        assert torch.allclose(store.w[:PARAMS], expected)
    assert store.staleness.maximum == 3 and rule.uncompensated == 0


async def test_dcasgd_trains_with_stale_gradients() -> None:
    core, finals = await run_local("dcasgd", [0.002, 0.02, 0.02], time_s=2.0)
    rule = core.rule
    assert isinstance(rule, DcasgdServer)
    assert core.store.staleness.maximum >= 2 and rule.uncompensated == 0
    assert len(rule.pulled) <= DcasgdParams().ring
    assert sum(core.store.held_s.values()) == 0.0
    assert finals[0]["steps"] >= 5 * finals[1]["steps"]
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < core.evals[0].loss


def test_bad_parameters_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^lam:"):
        DcasgdParams(lam=-0.1)
    with pytest.raises(ValueError, match=r"^ring:"):
        DcasgdParams(ring=0)
    with pytest.raises(ConfigError, match=r"^protocol\.lam:"):
        from_mapping(DcasgdParams, {"lam": float("nan")}, "protocol")
