"""A parameter without ``requires_grad`` stays where it is on the server too.

The workers' local steps leave a frozen parameter alone (weight decay included, as torch's
optimizers skip a parameter without a gradient); the server's own optimizer, which
gradient-pushing protocols (asp, ssp, bsp...) step with the workers' gradients, must too.
Expected values are SGD with momentum and weight decay written out here.
"""

from __future__ import annotations

import asyncio

import torch
from torch import nn

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings

LR, MOMENTUM, DECAY = 0.1, 0.9, 0.5


def test_a_gradient_step_on_the_server_leaves_a_frozen_layer_as_it_is() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    core = build_core(model, "asp", 1, ServerSettings(lr=LR, momentum=MOMENTUM,
                                                      weight_decay=DECAY))
    frozen = torch.cat([p.detach().flatten() for p in model[0].parameters()])
    trained = torch.cat([p.detach().flatten() for p in model[1].parameters()])
    cut = frozen.numel()
    gradient = torch.zeros(core.store.numel)
    gradient[cut:] = 1.0  # a worker's gradient is zero on its frozen slices

    async def two_steps() -> None:
        for _ in range(2):
            async with core.store.lock:
                await core.store.apply_gradient(gradient.clone(), [(0, core.store.version)])

    asyncio.run(two_steps())
    w = core.store.w
    assert torch.equal(w[:cut], frozen)
    buffer = None
    expected = trained.clone()
    for _ in range(2):
        g = 1.0 + DECAY * expected
        buffer = g if buffer is None else MOMENTUM * buffer + g
        expected = expected - LR * buffer
    assert torch.allclose(w[cut:], expected, atol=1e-6)
