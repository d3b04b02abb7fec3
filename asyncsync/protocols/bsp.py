"""BSP: bulk synchronous parallel (synchronous SGD).

Worker: compute a gradient on its batch at the current global version, push it, pull the
next version. Server: wait for all N gradients of the current version, then
``w <- opt_step(w, mean_i g_i)``, version += 1, and release the pulls. Every version
therefore aggregates exactly N gradients, all computed at that version.

Reference: L. G. Valiant, "A bridging model for parallel computation", CACM 1990.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import (
    NoParams,
    Protocol,
    Pull,
    Push,
    Reply,
    ServerRule,
    WorkerLoop,
    register,
)
from asyncsync.wire import WireError

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.worker import WorkerContext


class BspServer(ServerRule):
    """Barrier per version: the N-th gradient of a version triggers the step."""

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: NoParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self._sum: torch.Tensor | None = None
        self._contributors: list[tuple[int, int]] = []

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:  # accumulation awaits a thread: serialize pushes
            await self._accumulate(push)
        return {}

    async def _accumulate(self, push: Push) -> None:
        version = self.store.version
        if push.base_version != version:
            raise WireError(409, f"gradient of version {push.base_version}, "
                                 f"but the barrier is at version {version}")
        if any(worker == push.worker for worker, _ in self._contributors):
            raise WireError(409, f"worker {push.worker} already pushed for version {version}")
        total = self._sum
        self._sum = push.vector if total is None else await self.store.compute(
            torch.add, total, push.vector)
        self._contributors.append((push.worker, push.base_version))
        if len(self._contributors) == self.store.workers:
            mean = await self.store.compute(torch.div, self._sum, self.store.workers)
            contributors, self._sum, self._contributors = self._contributors, None, []
            await self.store.apply_gradient(mean, contributors)

    async def on_pull(self, pull: Pull) -> Reply:
        await self.store.wait_for(lambda: self.store.version > pull.base_version, pull.worker)
        return self.store.current()


class BspWorker(WorkerLoop):
    """Gradient, push, pull, adopt: one global step per iteration."""

    async def run(self, ctx: WorkerContext) -> None:
        while True:
            result, grad = await ctx.gradient()
            await ctx.push("gradient", grad, steps=1, samples=result.samples)
            vector, version, _ = await ctx.pull()
            await ctx.adopt(vector, version)


BSP = register(Protocol("bsp", "synchronous SGD: all N gradients per version, then one step",
                        NoParams, BspServer, BspWorker))
