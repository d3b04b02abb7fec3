"""EASGD: elastic averaging SGD, synchronous (``easgd``) and asynchronous (``easgd_async``).

Each worker keeps its own model x_i; the server keeps the center variable x~ (the model it
evaluates). Every tau local SGD steps a worker and the center pull toward each other
with the elastic weight alpha:

    ``x_i <- x_i - alpha (x_i - x~)``,  ``x~ <- x~ + alpha (x_i - x~)``.

The worker is pulled toward the center, never overwritten by it.

- ``easgd_async`` (the paper's Algorithm 1): after tau local steps the worker reads x~
  (a pull), computes ``d = x_i - x~``, sets ``x_i <- x_i - alpha d`` and pushes d; the
  server adds ``alpha d`` to its center as it is then, on arrival, version += 1. Nobody
  waits for anybody.
- ``easgd`` (synchronous, the paper's update with tau local steps per round): in round t
  every worker holds the center x~_t; after tau local steps it pushes ``d_i = x_i - x~_t``
  and sets ``x_i <- x_i - alpha d_i``; when the round has every live worker's difference,
  ``x~_{t+1} = x~_t + alpha sum_i d_i`` (a moving average with beta = N alpha), version
  += 1, and the workers pull x~_{t+1} for the next round.

Choices where the paper is open:

- **(choice)** ``alpha = 0`` (the default) means ``beta / N`` with beta = 0.9, the paper's
  setting (alpha = beta / p), N the run's size; both halves derive the same value. The
  synchronous form refuses ``N alpha > 1`` (the center would overshoot the workers' mean).
- **(choice)** tau defaults to 8 local steps, as the other periodic protocols here.
- **(choice)** The push carries the difference ``x_i - x~`` (kind ``delta``), not alpha
  times it; float buffers (e.g. BatchNorm statistics) take part in the exchange like
  parameters. Between exchanges the worker runs plain local SGD (EASGD, not EAMSGD).
- Membership: in ``easgd`` the round is the SDK's `RoundServer` (a lost worker's
  difference counts if it arrived, else the center moves with the others'; a rejoined worker starts
  from the center it joined with and the open round waits for it); in ``easgd_async``
  nothing waits, so a lost worker just stops contributing. A worker (re)joining adopts
  the center once, as every protocol's worker does at its join.

Reference: S. Zhang, A. Choromanska, Y. LeCun, "Deep learning with Elastic Averaging
SGD", NeurIPS 2015.
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
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import RoundServer, contributions

BETA = 0.9
"""The paper's moving-average rate beta = N alpha, used when alpha is 0."""


@dataclass(frozen=True)
class EasgdParams:
    """Parameters of EASGD (both forms)."""

    NOT_OFFERED = no_round_policies(
        "easgd_async", "it has no rounds: each elastic exchange is applied on arrival")

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "tau: local SGD steps between elastic exchanges")
    alpha: float = option(0.0, lambda v: 0 <= v < 1, "must be in [0, 1)",
                          "elastic weight (0: 0.9 / N, the paper's beta = 0.9)")

    def __post_init__(self) -> None:
        check_fields(self)

    def weight(self, workers: int) -> float:
        """The elastic weight alpha for a run of `workers` workers."""
        return self.alpha or BETA / workers


def check_sync_alpha(params: EasgdParams, workers: int) -> None:
    """Refuse an alpha whose synchronous round would move the center past the workers'
    mean (``N alpha > 1``)."""
    alpha = params.weight(workers)
    if alpha * workers > 1 + 1e-12:
        raise ValueError(f"alpha: N alpha = {workers} x {alpha:g} exceeds 1: the center "
                         "would overshoot the workers' mean (use alpha <= 1/N)")


@dataclass(frozen=True)
class EasgdSyncParams(EasgdParams):
    """Parameters of synchronous EASGD: EASGD's, with the bound ``N alpha <= 1``."""

    NOT_OFFERED = no_round_policies(
        "easgd", "its rounds are elastic exchanges of every worker, not the round barrier's")

    def check_workers(self, workers: int) -> None:
        """`check_sync_alpha` for a run of `workers` (a recipe check calls it; the server
        checks the same)."""
        check_sync_alpha(self, workers)


def pulled_toward(center: torch.Tensor, differences: list[torch.Tensor],
                  alpha: float) -> torch.Tensor:
    """``center + alpha * sum(differences)`` as a new tensor."""
    out = center.clone()
    for difference in differences:
        out.add_(difference, alpha=alpha)
    return out


class EasgdServer(RoundServer[EasgdParams]):
    """A round per version: the center moves by alpha times the sum of the live workers'
    differences (lost and rejoined workers as in every `RoundServer`)."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: EasgdParams, store: Store) -> None:
        super().__init__(params, store)
        check_sync_alpha(params, store.workers)
        self.alpha = params.weight(store.workers)

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        differences = [push.vector for push in pushes.values()]
        center = await self.store.compute(pulled_toward, self.store.w, differences, self.alpha)
        self.store.commit(center, contributions(pushes))


class EasgdAsyncServer(ServerRule[EasgdParams]):
    """Move the center by alpha times each difference on arrival.

    Nobody waits for anybody, so membership changes need no handling.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: EasgdParams, store: Store) -> None:
        super().__init__(params, store)
        self.alpha = params.weight(store.workers)

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            center = await self.store.compute(pulled_toward, self.store.w, [push.vector],
                                              self.alpha)
            self.store.commit(center, [(push.worker, push.base_version)])
        return {}


class EasgdWorker(WorkerLoop[EasgdParams]):
    """tau local steps; push ``x_i - x~_t`` and move toward x~_t; pull x~_{t+1}."""

    async def run(self, ctx: Context) -> None:
        tau, alpha = self.params.local_steps, self.params.weight(ctx.workers)
        center, version = await ctx.snapshot(), ctx.version  # the center it joined with
        while True:
            samples = (await ctx.steps(tau)).samples
            difference = await ctx.delta_since(center)
            await ctx.mix_toward(center, alpha)
            del center  # the next round's center is pulled below
            await ctx.push("delta", difference, steps=tau, samples=samples, base_version=version)
            del difference  # not held while the worker waits for the round's center
            center, version, _ = await ctx.pull(base_version=version)


class EasgdAsyncWorker(WorkerLoop[EasgdParams]):
    """tau local steps; read x~; push ``x_i - x~`` and move toward x~."""

    async def run(self, ctx: Context) -> None:
        tau, alpha = self.params.local_steps, self.params.weight(ctx.workers)
        while True:
            samples = (await ctx.steps(tau)).samples
            center, version, _ = await ctx.pull()
            difference = await ctx.delta_since(center)
            await ctx.mix_toward(center, alpha)
            del center  # read afresh after the next tau steps
            await ctx.push("delta", difference, steps=tau, samples=samples,
                           base_version=version)
            del difference


EASGD = register(Protocol("easgd", "elastic averaging SGD, synchronous: every tau steps "
                                   "workers and center pull toward each other (weight alpha)",
                          EasgdSyncParams, EasgdServer, EasgdWorker))
EASGD_ASYNC = register(Protocol("easgd_async", "elastic averaging SGD, asynchronous: each "
                                               "worker's elastic exchange applied on arrival",
                                EasgdParams, EasgdAsyncServer, EasgdAsyncWorker))
