"""ASP: asynchronous parallel SGD (Hogwild-style parameter server).

Worker: pull the current model, compute a gradient, push it, repeat. Server: apply each
gradient on arrival, ``w <- opt_step(w, g)``, version += 1. No worker ever waits for
another; the price is staleness (version at apply time minus the gradient's base version),
which the server records for every update.

Reference: J. Dean et al., "Large Scale Distributed Deep Networks" (Downpour SGD), NIPS 2012.
"""

from __future__ import annotations

from typing import Any

from asyncsync.protocols.base import NoParams, Protocol, Push, ServerRule, WorkerLoop, register
from asyncsync.protocols.ports import Context


class AspServer(ServerRule):
    """Apply every gradient as it arrives; pulls are answered at once.

    Nobody waits for anybody, so membership changes need no handling: a lost worker just
    stops contributing, and a rejoined one continues from the model it joined with.
    """

    push_kinds = frozenset({"gradient"})

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            await self.store.apply_gradient(push.vector, [(push.worker, push.base_version)])
        return {}


class AspWorker(WorkerLoop):
    """Pull, compute, push, without any barrier."""

    async def run(self, ctx: Context) -> None:
        while True:
            vector, version, _ = await ctx.pull()
            await ctx.adopt(vector, version)
            result, grad = await ctx.gradient()
            await ctx.push("gradient", grad, steps=1, samples=result.samples)


ASP = register(Protocol("asp", "asynchronous SGD: every gradient applied on arrival",
                        NoParams, AspServer, AspWorker))
