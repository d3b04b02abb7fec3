"""Overlap Local SGD: local steps never wait for the averaging of the anchor model.

Each worker keeps its local model ``w_i`` and an anchor ``z``, the average of all local
models at the previous synchronization point (initially the starting model). Every tau
local steps (default 8) the worker takes the result of the averaging it started tau steps
earlier as the new anchor (waiting only if it is still in flight), pulls its local model
toward it, ``w_i <- (1 - alpha) w_i + alpha z`` (alpha 0.2), pushes the pulled model and
averages it in the background while the next tau local steps run. Server: when the N models
of a round are in, ``w <- mean_i w_i``, version += 1, and the pulls are released. The
anchor is thus one round old, and communication is hidden whenever one averaging takes less
than tau local steps.

`Transfers` (background exchanges surfacing their failures at step boundaries) and
`mix_into` are shared with Streaming DiLoCo.

Reference: J. Wang, H. Liang, G. Joshi, "Overlap Local-SGD: An Algorithmic Approach to Hide
Communication Delays in Distributed SGD", ICASSP 2020.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import Protocol, WorkerLoop, register
from asyncsync.protocols.diloco import RoundServer
from asyncsync.schema import check_fields, option

if TYPE_CHECKING:
    from asyncsync.trainer import Trainer
    from asyncsync.worker import WorkerContext

Exchange = tuple[torch.Tensor, int]


@dataclass(frozen=True)
class OverlapLocalSgdParams:
    """Parameters of Overlap Local SGD."""

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "tau: local steps between synchronization points")
    alpha: float = option(0.2, lambda v: 0 < v <= 1, "must be in (0, 1]",
                          "how far the local model is pulled toward the anchor")

    def __post_init__(self) -> None:
        check_fields(self)


class Transfers:
    """A worker's background exchanges (a push, then a pull), at most one per key.

    `check` re-raises a failed exchange (`RunStopped` included) at a step boundary; leaving
    the ``async with`` block cancels and awaits whatever is still in flight.
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self._tasks: dict[int, asyncio.Task[Exchange]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._tasks

    def start(self, key: int, kind: str, vector: torch.Tensor, steps: int, samples: int,
              base_version: int, meta: dict[str, Any] | None = None) -> None:
        """Push `vector` and pull the answer in the background."""
        if key in self._tasks:
            raise RuntimeError(f"exchange {key} is already in flight")
        self._tasks[key] = asyncio.create_task(
            self._exchange(kind, vector, steps, samples, base_version, meta))

    async def _exchange(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                        base_version: int, meta: dict[str, Any] | None) -> Exchange:
        await self.ctx.push(kind, vector, steps, samples, meta=meta, base_version=base_version)
        pulled, version, _ = await self.ctx.pull(meta=meta, base_version=base_version)
        return pulled, version

    def check(self) -> None:
        """Raise the exception of any exchange that has failed."""
        for task in self._tasks.values():
            error = task.exception() if task.done() else None
            if error is not None:
                raise error

    async def finish(self, key: int) -> Exchange:
        """The pulled vector and version of exchange `key`, waiting if it is in flight."""
        result = await self._tasks[key]
        del self._tasks[key]
        return result

    async def __aenter__(self) -> Transfers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def mix_into(trainer: Trainer, target: torch.Tensor, weight: float, start: int,
             stop: int) -> None:
    """``w_i[start:stop] <- (1 - weight) w_i[start:stop] + weight target`` (compute thread)."""
    part = trainer.flat[start:stop]
    with torch.no_grad():
        part.mul_(1 - weight).add_(target.to(part.device), alpha=weight)


class OverlapLocalSgdServer(RoundServer):
    """A barrier per round: the new anchor is the mean of the N pushed models."""

    push_kinds = frozenset({"model"})

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return mean


class OverlapLocalSgdWorker(WorkerLoop):
    """tau local steps in one block; pull toward the anchor; average in the background.

    A failed averaging (e.g. the run stopped) surfaces when its result is taken, at the end
    of the block of local steps that ran while it was in flight.
    """

    async def run(self, ctx: WorkerContext) -> None:
        tau, alpha = self.params.local_steps, self.params.alpha
        anchor = await ctx.in_thread(ctx.trainer.vector_copy)
        version = ctx.version
        async with Transfers(ctx) as transfers:
            while True:
                samples = (await ctx.steps(tau)).samples
                if 0 in transfers:
                    anchor, version = await transfers.finish(0)
                await ctx.in_thread(mix_into, ctx.trainer, anchor, alpha, 0, len(anchor))
                model = await ctx.in_thread(ctx.trainer.vector_copy)
                transfers.start(0, "model", model, steps=tau, samples=samples,
                                base_version=version)


OVERLAP_LOCAL_SGD = register(Protocol(
    "overlap_local_sgd", "local SGD pulled toward an anchor averaged in the background",
    OverlapLocalSgdParams, OverlapLocalSgdServer, OverlapLocalSgdWorker))
