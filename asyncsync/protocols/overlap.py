"""Background exchanges for workers that keep computing while they talk to the server.

`Transfers` runs exchanges (e.g. `push_then_pull`: a push, then a pull, two requests) as
tasks, at most one per key, and surfaces their failures at step boundaries. `OverlapWorker`
is local SGD with one exchange always in flight, which a subclass's `send_progress` makes
(NBSync, WBSP-opt); Overlap Local SGD and Streaming DiLoCo drive `Transfers` themselves.
(The `Context.push_and_pull` verb is different: one request carrying both.)
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

import torch

from asyncsync.protocols.base import P, WorkerLoop
from asyncsync.protocols.ports import Context

Pulled = tuple[torch.Tensor, int]  # a global vector and its version
T = TypeVar("T")


class Transfers(Generic[T]):
    """A worker's background exchanges, at most one per key.

    `check` re-raises a failed exchange (`RunStopped` included) at a step boundary; leaving
    the ``async with`` block cancels and awaits whatever is still in flight.
    """

    def __init__(self) -> None:
        self._tasks: dict[int, asyncio.Task[T]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._tasks

    def running(self, key: int) -> bool:
        """Whether exchange `key` was started and has not ended yet."""
        task = self._tasks.get(key)
        return task is not None and not task.done()

    def start(self, key: int, exchange: Coroutine[Any, Any, T]) -> None:
        """Run `exchange` in the background under `key`."""
        if key in self._tasks:
            exchange.close()
            raise RuntimeError(f"exchange {key} is already in flight")
        self._tasks[key] = asyncio.create_task(exchange)

    def check(self) -> None:
        """Raise the exception of any exchange that has failed."""
        for task in self._tasks.values():
            error = task.exception() if task.done() else None
            if error is not None:
                raise error

    async def finish(self, key: int) -> T:
        """The result of exchange `key`, waiting if it is in flight."""
        result = await self._tasks[key]
        del self._tasks[key]
        return result

    async def __aenter__(self) -> Transfers[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def push_then_pull(ctx: Context, kind: str, vector: torch.Tensor, steps: int,
                   samples: int, base_version: int,
                   meta: dict[str, Any] | None = None) -> Pulled:
    """Push `vector`, then pull the answer (with the same `meta` and base version): two
    requests, so the rule may answer the pull after other workers' pushes."""
    await ctx.push(kind, vector, steps, samples, meta=meta, base_version=base_version)
    del vector  # not held while the pull waits (in a population, perhaps for rounds)
    pulled, version, _ = await ctx.pull(meta=meta, base_version=base_version)
    return pulled, version


class OverlapWorker(WorkerLoop[P]):
    """Local SGD that never waits for the network: one exchange runs in the background.

    After each local step, if no exchange is in flight (or the last one has finished), the
    progress since the anchor becomes the next exchange's delta; a model the finished
    exchange brought back is adopted first and becomes the anchor. Errors of the exchange,
    `RunStopped` included, surface at that step boundary; an exchange still in flight when
    the loop ends is cancelled.
    """

    async def run(self, ctx: Context) -> None:
        anchor = await ctx.snapshot()
        steps = samples = 0
        async with Transfers[Pulled | None]() as transfers:
            while True:
                result = await ctx.steps(1)
                steps += 1
                samples += result.samples
                if transfers.running(0):
                    continue
                pulled = await transfers.finish(0) if 0 in transfers else None
                delta, anchor = await ctx.delta_and_snapshot(anchor)
                if pulled is not None:
                    await ctx.adopt(*pulled)
                    anchor = pulled[0]
                transfers.start(0, self.send_progress(ctx, delta, steps, samples))
                steps = samples = 0

    @abstractmethod
    async def send_progress(self, ctx: Context, delta: torch.Tensor, steps: int,
                       samples: int) -> Pulled | None:
        """Push `delta` (`steps` local steps); return a global model to adopt, if any."""
