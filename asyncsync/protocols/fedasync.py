"""FedAsync: asynchronous federated optimization with staleness-weighted mixing.

Worker: pull ``(w, t)``, run H local SGD steps from it, optionally on the proximal objective
``f(x) + rho/2 ||x - w||^2`` (rho = 0 by default: plain local SGD), and push the resulting
model ``x_new`` with its base version ``tau = t``. Server, on arrival of each model:
``alpha_t = alpha * s(t - tau)`` with t the current version, then
``w <- (1 - alpha_t) w + alpha_t x_new``, version += 1. The weight depends only on that
update's own staleness, never on earlier updates. Staleness functions s(d):

- ``constant``: 1
- ``polynomial``: ``(d + 1) ** -a``
- ``hinge``: 1 if ``d <= b``, else ``1 / (a (d - b) + 1)``

The push reply's meta carries the weight that was applied (``mixing_weight``).

Reference: C. Xie, S. Koyejo, I. Gupta, "Asynchronous Federated Optimization",
OPT 2020 (arXiv:1903.03934).
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
    option,
    register,
)
from asyncsync.protocols.ports import Context

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


@dataclass(frozen=True)
class FedAsyncParams:
    """Parameters of FedAsync."""

    alpha: float = option(0.6, lambda v: 0 < v <= 1, "must be in (0, 1]",
                          "mixing hyperparameter alpha")
    staleness_fn: str = option("polynomial", lambda v: v in STALENESS_FUNCTIONS,
                               f"must be one of {', '.join(STALENESS_FUNCTIONS)}",
                               "s(d): constant | polynomial | hinge")
    a: float = option(0.5, lambda v: v >= 0, "must be >= 0",
                      "exponent (polynomial) or slope (hinge) of s")
    b: int = option(4, lambda v: v >= 0, "must be >= 0",
                    "hinge: largest staleness still weighted 1")
    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "H: local SGD steps per update")
    rho: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                        "weight of the proximal term rho/2 ||x - w||^2")

    def __post_init__(self) -> None:
        check_fields(self)

    def staleness_weight(self, staleness: int) -> float:
        """s(staleness) for the configured staleness function."""
        if self.staleness_fn == "constant":
            return 1.0
        if self.staleness_fn == "polynomial":
            return float((staleness + 1) ** -self.a)
        if staleness <= self.b:
            return 1.0
        return 1.0 / (self.a * (staleness - self.b) + 1.0)


class FedAsyncServer(ServerRule):
    """Mix each pushed model into ``w`` on arrival, weighted by alpha * s(staleness).

    Nobody waits for anybody, so membership changes need no handling: a lost worker just
    stops contributing, and a rejoined one continues from the model it joined with.
    """

    push_kinds = frozenset({"model"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            staleness = self.store.version - push.base_version
            weight = self.params.alpha * self.params.staleness_weight(staleness)
            w = self.store.w
            new = await self.store.compute(torch.lerp, w, push.vector, weight)
            self.store.commit(new, [(push.worker, push.base_version)])
        return {"mixing_weight": weight}


class FedAsyncWorker(WorkerLoop):
    """Pull, H local (proximal) steps, push the model with its base version."""

    async def run(self, ctx: Context) -> None:
        steps, rho = self.params.local_steps, self.params.rho
        while True:
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)
            result = await ctx.steps(steps, proximal=(anchor, rho) if rho > 0 else None)
            model = await ctx.snapshot()
            await ctx.push("model", model, steps=steps, samples=result.samples,
                           base_version=version)


FEDASYNC = register(Protocol("fedasync", "asynchronous federated optimization: models mixed "
                                         "on arrival with weight alpha * s(staleness)",
                             FedAsyncParams, FedAsyncServer, FedAsyncWorker))
