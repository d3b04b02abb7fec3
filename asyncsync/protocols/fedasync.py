"""FedAsync: asynchronous federated optimization with staleness-weighted mixing.

Worker: pull ``(w, t)``, run H local SGD steps from it, optionally on the proximal objective
``f(x) + rho/2 ||x - w||^2`` (rho = 0 by default: plain local SGD), and push the resulting
model ``x_new`` with its base version ``tau = t``. Server, on arrival of each model:
``alpha_t = alpha * s(t - tau)`` with t the current version, then
``w <- (1 - alpha_t) w + alpha_t x_new``, version += 1. The weight depends only on that
update's own staleness, never on earlier updates. The staleness functions s(d) (constant,
polynomial, hinge) are the SDK's, in `asyncsync.protocols.staleness`.

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
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Context
from asyncsync.protocols.staleness import StalenessOptions


@dataclass(frozen=True)
class FedAsyncParams(StalenessOptions):
    """Parameters of FedAsync (with the staleness function's)."""

    NOT_OFFERED = no_round_policies(
        "fedasync", "it has no rounds: each model is mixed in on arrival")

    alpha: float = option(0.6, lambda v: 0 < v <= 1, "must be in (0, 1]",
                          "mixing hyperparameter alpha")
    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "H: local SGD steps per update")
    rho: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                        "weight of the proximal term rho/2 ||x - w||^2")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_staleness()


class FedAsyncServer(ServerRule[FedAsyncParams]):
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


class FedAsyncWorker(WorkerLoop[FedAsyncParams]):
    """Pull, H local (proximal) steps, push the model with its base version."""

    async def run(self, ctx: Context) -> None:
        steps, rho = self.params.local_steps, self.params.rho
        while True:
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)
            proximal = (anchor, rho) if rho > 0 else None
            del anchor  # adopted: kept only as the proximal term's center
            result = await ctx.steps(steps, proximal=proximal)
            del proximal
            model = await ctx.snapshot()
            await ctx.push("model", model, steps=steps, samples=result.samples,
                           base_version=version)
            del model


FEDASYNC = register(Protocol("fedasync", "asynchronous federated optimization: models mixed "
                                         "on arrival with weight alpha * s(staleness)",
                             FedAsyncParams, FedAsyncServer, FedAsyncWorker))
