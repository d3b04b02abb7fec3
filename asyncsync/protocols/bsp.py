"""BSP: bulk synchronous parallel (synchronous SGD).

Worker: compute a gradient on its batch at the current global version, push it, pull the
next version. Server: wait for the gradients of every live worker at the current version,
then ``w <- opt_step(w, mean_i g_i)``, version += 1, and release the pulls. Every version
therefore aggregates one gradient per worker in the run, all computed at that version.
The barrier is the SDK's `RoundServer`; a lost worker's gradient of the open round is
withdrawn and the step is taken with the others', and a rejoined worker computes its
gradient at the version it joined and the barrier waits for it.

Reference: L. G. Valiant, "A bridging model for parallel computation", CACM 1990.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from asyncsync.protocols.base import NoParams, Protocol, Push, WorkerLoop, register
from asyncsync.protocols.ports import Context
from asyncsync.protocols.rounds import RoundServer, average, contributions


class BspServer(RoundServer):
    """A round per version: the weighted mean gradient of the round makes one server step
    (weights: `weight`, equal by default)."""

    push_kinds = frozenset({"gradient"})

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        gradients = [push.vector for push in pushes.values()]
        weights = [self.weight(push) for push in pushes.values()]
        mean = await self.store.compute(average, gradients, weights)
        await self.store.apply_gradient(mean, contributions(pushes))


async def push_then_pull(ctx: Context, kind: str, vector: torch.Tensor, steps: int,
                         samples: int, meta: dict[str, Any] | None = None
                         ) -> tuple[torch.Tensor, int, dict[str, Any]]:
    """Push, then pull the next version, with the pull already in flight during the push.

    The pull waits at the server until the push's round has closed, so issuing it early
    changes nothing but saves a round trip per iteration. Returns the pull's
    ``(vector, version, meta)``.
    """
    pull = asyncio.create_task(ctx.pull())
    try:
        await ctx.push(kind, vector, steps=steps, samples=samples, meta=meta)
        return await pull
    finally:
        pull.cancel()  # no-op when it finished; either way its outcome is collected
        await asyncio.gather(pull, return_exceptions=True)


class BspWorker(WorkerLoop):
    """Gradient, push, pull, adopt: one global step per iteration."""

    async def run(self, ctx: Context) -> None:
        while True:
            result, grad = await ctx.gradient()
            vector, version, _ = await push_then_pull(ctx, "gradient", grad, 1, result.samples)
            await ctx.adopt(vector, version)


BSP = register(Protocol("bsp", "synchronous SGD: every live worker's gradient per version, "
                               "then one step", NoParams, BspServer, BspWorker))
