"""ASP's staleness-aware learning rate (Zhang et al., IJCAI 2016): a gradient of staleness
tau is applied at rate eta / tau (tau = 0 counts as 1); off, every gradient at rate eta."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.asp import AspParams, AspServer
from asyncsync.protocols.base import Push
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_local

LR = 0.5
PARAMS = 6  # the vector's last 2 slots are buffers (values, not gradients)

# (base version, version when it lands): staleness 0, 0, 2, 1, 4
ARRIVALS = [(0, 0), (1, 1), (0, 2), (2, 3), (0, 4)]


async def apply_all(params: AspParams) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                list[float]]:
    """Push one random gradient per arrival; the models before each push, the gradients,
    and the reply's `lr_scale`."""
    gen = torch.Generator().manual_seed(2)
    store = ParameterStore(torch.randn(8, generator=gen), 2, FlatSGD(LR), num_params=PARAMS)
    rule = AspServer(params, store)
    models, grads, scales = [], [], []
    for i, (base, version) in enumerate(ARRIVALS):
        assert store.version == version
        g = torch.randn(8, generator=gen)
        models.append(store.w)
        grads.append(g)
        meta = await rule.on_push(Push(i % 2, base, "gradient", g.clone(), 1, 16))
        scales.append(meta["lr_scale"])
    models.append(store.w)
    return models, grads, scales


async def test_staleness_aware_rate_divides_eta_by_tau() -> None:
    models, grads, scales = await apply_all(AspParams(staleness_lr=True))
    for (base, version), before, after, g in zip(ARRIVALS, models, models[1:], grads,
                                                 strict=False):
        tau = max(version - base, 1)
        assert torch.allclose(after[:PARAMS], before[:PARAMS] - LR / tau * g[:PARAMS])
        assert torch.equal(after[PARAMS:], g[PARAMS:])  # buffers are replaced, not scaled
    assert scales == [1.0, 1.0, 0.5, 1.0, 0.25]


async def test_without_the_option_every_gradient_gets_eta() -> None:
    models, grads, scales = await apply_all(AspParams())
    for before, after, g in zip(models, models[1:], grads, strict=False):
        assert torch.allclose(after[:PARAMS], before[:PARAMS] - LR * g[:PARAMS])
    assert scales == [1.0] * len(ARRIVALS)


async def test_asp_with_the_staleness_aware_rate_trains() -> None:
    core, finals = await run_local("asp", [0.002, 0.02, 0.02],
                                   params=AspParams(staleness_lr=True), time_s=2.0)
    assert core.store.staleness.maximum >= 2  # some gradients were damped
    assert sum(core.store.held_s.values()) == 0.0
    assert all(f["steps"] >= 50 for f in finals)
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < core.evals[0].loss


def test_the_option_comes_from_a_recipe_table() -> None:
    assert from_mapping(AspParams, {"staleness_lr": True}, "protocol").staleness_lr
    with pytest.raises(ConfigError, match=r"^protocol\.staleness_lr: expected bool"):
        from_mapping(AspParams, {"staleness_lr": 1}, "protocol")
