"""ASP: asynchronous parallel SGD (Hogwild-style parameter server).

Worker: pull the current model, compute a gradient, push it, repeat. Server: apply each
gradient on arrival, ``w <- opt_step(w, g)``, version += 1. No worker ever waits for
another; the price is staleness (version at apply time minus the gradient's base version),
which the server records for every update.

Option ``staleness_lr`` (off by default): the staleness-aware learning rate of Zhang et
al., ``eta / tau`` for a gradient of staleness tau, applied by dividing the gradient's
parameter slots by tau before the server's optimizer step (exactly ``eta / tau`` with
plain SGD; with server momentum or weight decay only the gradient's share is scaled).
**(choice)** A gradient of staleness 0 (no update since its pull) is treated as tau = 1,
so the rate never exceeds eta. The push reply's meta carries the factor (``lr_scale``).

References: J. Dean et al., "Large Scale Distributed Deep Networks" (Downpour SGD), NIPS
2012; W. Zhang, S. Gupta, X. Lian, J. Liu, "Staleness-aware Async-SGD for Distributed
Deep Learning", IJCAI 2016.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import (
    Protocol,
    Push,
    ServerRule,
    WorkerLoop,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Context


@dataclass(frozen=True)
class AspParams:
    """Parameters of ASP."""

    NOT_OFFERED = no_round_policies(
        "asp", "it has no rounds: each gradient is applied on arrival")

    staleness_lr: bool = option(False, help="staleness-aware rate: eta / max(tau, 1) for a "
                                            "gradient of staleness tau")

    def __post_init__(self) -> None:
        check_fields(self)


def divide_params(gradient: torch.Tensor, num_params: int, tau: int) -> torch.Tensor:
    """`gradient` with its first `num_params` slots (the parameters) divided by `tau`, in
    place (buffer slots carry values, not gradients)."""
    gradient[:num_params].div_(tau)
    return gradient


class AspServer(ServerRule[AspParams]):
    """Apply every gradient as it arrives (optionally at rate eta / tau); pulls are
    answered at once.

    Nobody waits for anybody, so membership changes need no handling: a lost worker just
    stops contributing, and a rejoined one continues from the model it joined with.
    """

    push_kinds = frozenset({"gradient"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            gradient, meta = push.vector, {"lr_scale": 1.0}
            if self.params.staleness_lr:
                tau = max(self.store.version - push.base_version, 1)
                gradient = await self.store.compute(divide_params, gradient,
                                                    self.store.num_params, tau)
                meta["lr_scale"] = 1.0 / tau
            await self.store.apply_gradient(gradient, [(push.worker, push.base_version)])
        return meta


class AspWorker(WorkerLoop[AspParams]):
    """Pull, compute, push, without any barrier."""

    async def run(self, ctx: Context) -> None:
        while True:
            vector, version, _ = await ctx.pull()
            await ctx.adopt(vector, version)
            result, grad = await ctx.gradient(copy=False)  # sent before the next step
            await ctx.push("gradient", grad, steps=1, samples=result.samples)


ASP = register(Protocol("asp", "asynchronous SGD: every gradient applied on arrival "
                               "(optionally at rate eta / staleness)",
                        AspParams, AspServer, AspWorker))
