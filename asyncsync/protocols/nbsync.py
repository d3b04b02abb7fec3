"""NBSync: local computing and global synchronization run in parallel.

Worker: trains local SGD continuously and never blocks on the network. It keeps an anchor
``a`` and at most one synchronization in flight: push a delta, then pull the new global
model, as a background task. At the first step boundary after that task completes,
``d <- w_i - a`` (the progress made while the synchronization was in flight),
``w_i <- w_new``, ``a <- w_new``, and the next synchronization starts at once with ``d``.
Local steps per round are therefore flexible and differentiated: fast workers do more,
slow workers at least one. The first synchronization starts after the first local step and
pushes that step; its anchor is the local model at that moment.

Server: with ``server_mode = "sync"`` (the default) it collects one delta per worker per
round, then ``w <- w + (1/N) sum_i delta_i``, version += 1, and answers the pulls. With
``server_mode = "async"`` it applies ``w <- w + delta / N`` on arrival, one version per
delta, and answers pulls at once.

Choices: synchronous rounds by default, the asynchronous form as the ``server_mode``
parameter.

Reference: H. Zhou, Z. Li, H. Yu, L. Luo, G. Sun, "NBSync: Parallelism of Local Computing
and Global Synchronization for Fast Distributed Machine Learning in WANs", IEEE Transactions
on Services Computing, 2023 (doi:10.1109/TSC.2023.3304312).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import (
    Protocol,
    Pull,
    Push,
    Reply,
    ServerRule,
    WorkerLoop,
    register,
)
from asyncsync.schema import check_fields, option
from asyncsync.wire import WireError

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.trainer import Trainer
    from asyncsync.worker import WorkerContext

SERVER_MODES = ("sync", "async")
Pulled = tuple[torch.Tensor, int]  # a global vector and its version


@dataclass(frozen=True)
class NbsyncParams:
    """NBSync's parameters."""

    server_mode: str = option("sync", lambda v: v in SERVER_MODES,
                              f"must be one of {', '.join(SERVER_MODES)}",
                              "sync: one delta per worker per round; async: apply on arrival")

    def __post_init__(self) -> None:
        check_fields(self)


class NbsyncServer(ServerRule):
    """Rounds of one delta per worker (or every delta on arrival, in async mode)."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: NbsyncParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.synchronous = params.server_mode == "sync"
        self._sum: torch.Tensor | None = None
        self._contributions: list[tuple[int, int]] = []

    async def on_push(self, push: Push) -> dict[str, Any]:
        n = self.store.workers
        async with self.store.lock:
            if not self.synchronous:
                new = await self.store.compute(lambda: self.store.w + push.vector / n)
                self.store.commit(new, [(push.worker, push.base_version)])
                return {}
            version = self.store.version
            if push.base_version != version:
                raise WireError(409, f"delta of version {push.base_version}, "
                                     f"but the round is at version {version}")
            if any(worker == push.worker for worker, _ in self._contributions):
                raise WireError(409, f"worker {push.worker} already pushed in this round")
            total = push.vector if self._sum is None else await self.store.compute(
                torch.add, self._sum, push.vector)
            if len(self._contributions) + 1 < n:
                self._sum = total
                self._contributions.append((push.worker, push.base_version))
                return {}
            new = await self.store.compute(lambda: self.store.w + total / n)
            # nothing awaited after the state changes: a cancelled request changed nothing
            contributions = [*self._contributions, (push.worker, push.base_version)]
            self._sum, self._contributions = None, []
            self.store.commit(new, contributions)
        return {}

    async def on_pull(self, pull: Pull) -> Reply:
        if self.synchronous:
            await self.store.wait_for(lambda: self.store.version > pull.base_version,
                                      pull.worker)
        return self.store.current()


def split_progress(trainer: Trainer, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w - anchor, w)``: the progress since `anchor`, and a copy of the local vector."""
    now = trainer.vector_copy()
    return now - anchor, now


class OverlapWorker(WorkerLoop):
    """Local SGD that never waits for the network: one exchange runs in the background.

    After each local step, if no exchange is in flight (or the last one has finished), the
    progress since the anchor becomes the next exchange's delta; a model the finished
    exchange brought back is adopted first and becomes the anchor. Errors of the exchange,
    `RunStopped` included, surface at that step boundary; an exchange still in flight when
    the loop ends is cancelled.
    """

    async def run(self, ctx: WorkerContext) -> None:
        anchor = await ctx.in_thread(ctx.trainer.vector_copy)
        exchange: asyncio.Task[Pulled | None] | None = None
        steps = samples = 0
        try:
            while True:
                result = await ctx.steps(1)
                steps += 1
                samples += result.samples
                if exchange is not None and not exchange.done():
                    continue
                pulled = None if exchange is None else exchange.result()
                delta, anchor = await ctx.in_thread(split_progress, ctx.trainer, anchor)
                if pulled is not None:
                    await ctx.adopt(*pulled)
                    anchor = pulled[0]
                exchange = asyncio.create_task(self.exchange(ctx, delta, steps, samples))
                steps = samples = 0
        finally:
            await _discard(exchange)

    @abstractmethod
    async def exchange(self, ctx: WorkerContext, delta: torch.Tensor, steps: int,
                       samples: int) -> Pulled | None:
        """Push `delta` (`steps` local steps); return a global model to adopt, if any."""


async def _discard(task: asyncio.Task[Pulled | None] | None) -> None:
    """Cancel `task` if it is still running and wait for it to end."""
    if task is None:
        return
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # mark it retrieved: the loop is already ending with its own error


class NbsyncWorker(OverlapWorker):
    """Push the progress of the last round, then pull the next global model."""

    async def exchange(self, ctx: WorkerContext, delta: torch.Tensor, steps: int,
                       samples: int) -> Pulled:
        await ctx.push("delta", delta, steps=steps, samples=samples)
        vector, version, _ = await ctx.pull()
        return vector, version


NBSYNC = register(Protocol("nbsync", "non-blocking sync: local SGD never stops; one delta "
                                     "push + model pull always in flight",
                           NbsyncParams, NbsyncServer, NbsyncWorker))
