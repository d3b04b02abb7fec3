"""BSP: bulk synchronous parallel (synchronous SGD), and the per-version barrier it is built on.

Worker: compute a gradient on its batch at the current global version, push it, pull the
next version. Server: wait for the gradients of every live worker at the current version,
then ``w <- opt_step(w, mean_i g_i)``, version += 1, and release the pulls. Every version
therefore aggregates one gradient per worker in the run, all computed at that version.

`BarrierServer` (one round per version over the live workers, with its membership rules)
is shared with local SGD, FedAvg, ESync, NBSync and LB-BSP.

Reference: L. G. Valiant, "A bridging model for parallel computation", CACM 1990.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Sequence, Set
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


def average(vectors: Sequence[torch.Tensor],
            weights: Sequence[float] | None = None) -> torch.Tensor:
    """``sum_i w_i v_i / sum_i w_i`` (the plain mean without weights) as a new tensor.

    O(model) per vector: call it through ``store.compute``.
    """
    scales = [1.0] * len(vectors) if weights is None else list(weights)
    total = vectors[0] * scales[0]
    for vector, scale in zip(vectors[1:], scales[1:], strict=True):
        total.add_(vector, alpha=scale)
    return total.div_(sum(scales))


def contributions(pushes: dict[int, Push]) -> list[tuple[int, int]]:
    """``(worker, base_version)`` of each push, in arrival order (for `ParameterStore.commit`)."""
    return [(push.worker, push.base_version) for push in pushes.values()]


class BarrierServer(ServerRule):
    """A round per version: one push from each member, all based on that version.

    The open round waits for its `members` (every live worker by default). A push based on
    another version, from a worker that is not a member, or a second one from the same
    worker is refused with a 409 and changes nothing. When every member has pushed,
    `close_round` commits the round. A worker that leaves or is lost has its push of the
    open round withdrawn, and the round closes at once if every remaining member has
    pushed (unless the run is stopping); a worker that (re)joins is a member of the open
    round, which then waits for it.
    A push or a leave is processed to its end even if its request is cancelled, and a join
    waits for a round being committed, so that the joiner starts from the new version.

    Attributes:
        pushes: the open round's pushes by worker, in arrival order.
    """

    def __init__(self, params: Any, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.pushes: dict[int, Push] = {}

    def members(self) -> Set[int]:
        """The workers the open round waits for: every live worker."""
        return self.store.live

    def take(self, push: Push) -> None:
        """Check a push about to join the round (raise `WireError` to refuse it)."""

    def left(self, worker: int) -> None:
        """Forget what would make others wait for `worker`, which left (under the lock)."""

    def joined(self, worker: int) -> None:
        """Set up `worker`, which (re)joined the run (under the lock)."""

    @abstractmethod
    async def close_round(self, pushes: dict[int, Push]) -> None:
        """Commit the round made of `pushes` (under the lock). Await only before the commit,
        so that the round is either committed or left as it was."""

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            version = self.store.version
            if push.base_version != version:
                raise WireError(409, f"push based on version {push.base_version}, but the "
                                     f"round in progress is at version {version}")
            if push.worker not in self.members():
                raise WireError(409, f"worker {push.worker} does not take part in the round "
                                     f"of version {version}")
            if push.worker in self.pushes:
                raise WireError(409, f"worker {push.worker} already pushed for version "
                                     f"{version}")
            self.take(push)
            self.pushes[push.worker] = push
            await self._close_if_complete()
        return {}

    async def _close_if_complete(self) -> None:
        if self.pushes and self.pushes.keys() >= self.members():
            await self.close_round(self.pushes)
            self.pushes = {}

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer with the first version after the pull's base version."""
        await self.store.wait_for(lambda: self.store.version > pull.base_version, pull.worker)
        return self.store.current()

    async def on_leave(self, worker: int) -> None:
        async with self.store.lock:
            self.pushes.pop(worker, None)
            self.left(worker)
            await self._close_if_complete()

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            self.joined(worker)


class BspServer(BarrierServer):
    """Barrier per version over the live workers: their mean gradient makes the step.

    A lost worker's gradient of the open round is withdrawn and the step is taken with the
    others'; a rejoined worker computes its gradient at the version it joined and the
    barrier waits for it.
    """

    push_kinds = frozenset({"gradient"})

    async def close_round(self, pushes: dict[int, Push]) -> None:
        gradients = [push.vector for push in pushes.values()]
        mean = await self.store.compute(average, gradients)
        await self.store.apply_gradient(mean, contributions(pushes))


async def push_then_pull(ctx: WorkerContext, kind: str, vector: torch.Tensor, steps: int,
                         samples: int) -> tuple[torch.Tensor, int, dict[str, Any]]:
    """Push, then pull the next version, with the pull already in flight during the push.

    The pull waits at the server until the version it asks beyond is committed, so issuing
    it early changes nothing but saves a round trip per iteration. Returns the pull's
    ``(vector, version, meta)``.
    """
    pull = asyncio.create_task(ctx.pull())
    try:
        await ctx.push(kind, vector, steps=steps, samples=samples)
        return await pull
    finally:
        pull.cancel()  # no-op when it finished; either way its outcome is collected
        await asyncio.gather(pull, return_exceptions=True)


class BspWorker(WorkerLoop):
    """Gradient, push, pull, adopt: one global step per iteration."""

    async def run(self, ctx: WorkerContext) -> None:
        while True:
            result, grad = await ctx.gradient()
            vector, version, _ = await push_then_pull(ctx, "gradient", grad, 1, result.samples)
            await ctx.adopt(vector, version)


BSP = register(Protocol("bsp", "synchronous SGD: every live worker's gradient per version, "
                               "then one step", NoParams, BspServer, BspWorker))
