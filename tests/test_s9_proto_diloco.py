"""DiLoCo's outer learning rate defaults by optimizer: the paper's 0.7 for Nesterov SGD,
FedOpt's 1e-2 for the adaptive ones (an adaptive step moves each parameter by about the
rate whatever the delta's size: at 0.7 it diverged on small models). The first step of
bias-corrected Adam is ``w - lr g / (|g| + tau)``, computed here by hand."""

from __future__ import annotations

import torch

from asyncsync.protocols.base import Push
from asyncsync.protocols.diloco import DilocoParams, DilocoServer
from asyncsync.protocols.testing import FakeStore


async def _one_round(params: DilocoParams, w0: torch.Tensor,
                     deltas: list[torch.Tensor]) -> torch.Tensor:
    store = FakeStore(w0.clone(), len(deltas))
    rule = DilocoServer(params, store)
    for worker, delta in enumerate(deltas):
        await rule.on_push(Push(worker, 0, "delta", delta.clone(), 4, 64))
    assert store.version == 1
    return store.w


async def test_adaptive_outer_steps_default_to_fedopts_rate() -> None:
    w0 = torch.tensor([1.0, -2.0, 0.5, 3.0])
    deltas = [torch.tensor([0.2, -0.4, 0.0, 1.0]), torch.tensor([0.4, 0.0, -0.2, 3.0])]
    g = -(deltas[0] + deltas[1]) / 2  # the pseudo-gradient
    for lr, params in [(1e-2, DilocoParams(outer_optimizer="adam")),
                       (0.3, DilocoParams(outer_optimizer="adam", outer_lr=0.3))]:
        expected = w0 - lr * g / (g.abs() + 1e-3)
        assert torch.allclose(await _one_round(params, w0, deltas), expected, atol=1e-7)


async def test_sgd_keeps_the_papers_nesterov_step() -> None:
    w0 = torch.tensor([1.0, -2.0])
    deltas = [torch.tensor([0.5, 1.0]), torch.tensor([1.5, -1.0])]
    g = -(deltas[0] + deltas[1]) / 2
    # torch's first Nesterov step: buffer = g, direction = g + 0.9 g
    expected = w0 - 0.7 * (g + 0.9 * g)
    assert torch.allclose(await _one_round(DilocoParams(), w0, deltas), expected)
