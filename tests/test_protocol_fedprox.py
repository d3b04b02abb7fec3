"""FedProx as an option of local SGD and FedAvg: local steps descend on
``F_i(x) + mu/2 ||x - w||^2`` (mu = 0: plain local SGD), so a large mu keeps the local
model near the global one."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from asyncsync.protocols.base import Push
from asyncsync.protocols.fedavg import FedAvgParams
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer
from asyncsync.training.trainer import Trainer
from tests.helpers import run_local


def regression() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(3)
    return torch.nn.Linear(4, 2), (torch.randn(8, 4), torch.randn(8, 2))


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_a_local_step_is_sgd_on_the_proximal_objective(mu: float) -> None:
    model, (x, y) = regression()
    reference = copy.deepcopy(model)
    trainer = Trainer(model, lambda size: (x, y), lr=0.1, loss_fn=F.mse_loss, device="cpu")
    gen = torch.Generator().manual_seed(4)
    center = trainer.flat + torch.randn(trainer.numel, generator=gen)
    for _ in range(3):
        trainer.local_step(8, center, mu)
    # by hand: torch.optim.SGD on f(x) + mu/2 ||x - center||^2
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    anchors = [center[:8].view(2, 4), center[8:]]
    for _ in range(3):
        sgd.zero_grad()
        proximal = sum(((p - a) ** 2).sum() for p, a in
                       zip(reference.parameters(), anchors, strict=True))
        (F.mse_loss(reference(x), y) + mu / 2 * proximal).backward()
        sgd.step()
    expected = torch.cat([p.detach().flatten() for p in reference.parameters()])
    assert torch.allclose(trainer.flat, expected, atol=1e-6)


@pytest.mark.parametrize(("protocol", "params"), [
    ("local_sgd", lambda mu: LocalSgdParams(local_steps=8, mu=mu)),
    ("fedavg", lambda mu: FedAvgParams(local_steps=8, mu=mu)),
])
async def test_a_large_mu_keeps_local_models_near_the_global_one(
        protocol: str, params: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    norms: list[float] = []
    original = LocalSgdServer.on_push

    async def recording(self: LocalSgdServer, push: Push) -> dict[str, Any]:
        norms.append(float(push.vector.norm()))
        return await original(self, push)

    monkeypatch.setattr(LocalSgdServer, "on_push", recording)
    means = {}
    # lr * mu = 1: each proximal step pulls x all the way back to w before the SGD step,
    # so x stays one gradient step from w, however many steps the round has
    for mu in (0.0, 10.0):
        norms.clear()
        await run_local(protocol, [0.0], params=params(mu), max_steps=80, lr=0.1)
        assert len(norms) >= 8
        means[mu] = sum(norms) / len(norms)
    assert means[0.0] > 2.5 * means[10.0], means


async def test_fedavg_with_a_proximal_term_trains() -> None:
    core, _ = await run_local("fedavg", [0.0, 0.002, 0.006],
                              params=FedAvgParams(local_steps=4, mu=0.01), time_s=2.0)
    assert core.store.version >= 20
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < 0.6 * core.evals[0].loss


def test_a_negative_mu_names_the_parameter() -> None:
    for params in (LocalSgdParams, FedAvgParams):
        with pytest.raises(ValueError, match=r"^mu:"):
            params(mu=-0.1)
