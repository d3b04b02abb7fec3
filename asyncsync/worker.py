"""Worker: owns a Trainer and a transport, and runs its protocol's `WorkerLoop`.

Local computation runs in a dedicated thread (one per worker), so the event loop keeps
uploading and downloading while a step computes; torch releases the GIL in its kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import torch
from torch import nn

from asyncsync.hetero.compute import ComputeProfile, StaticSlowdown
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.metrics import JsonlLog, WorkerMetrics
from asyncsync.protocols.base import Protocol, get_protocol
from asyncsync.trainer import BatchSource, LossFn, StepResult, Trainer
from asyncsync.transport.base import RequestRejected, Transport
from asyncsync.transport.http_client import HttpTransport

T = TypeVar("T")


RESYNC_STATUSES = frozenset({409, 410})
"""Refusals after which a worker rejoins and restarts its loop: 410, the server no longer
counts it (dropped after a timeout, or restarted); 409, its request no longer fits the
round (e.g. it raced a membership change)."""


class RunStopped(Exception):
    """The run is over (the server said stop, or the worker reached `max_steps`)."""


class WorkerContext:
    """What a `WorkerLoop` sees: compute in the worker's thread, and talk to the server.

    Attributes:
        rank: this worker's rank; `workers`: how many workers the run has.
        version: the global version the local model was last adopted from.
        batch_size: the default local batch size.
    """

    def __init__(self, rank: int, run_id: str, transport: Transport, trainer: Trainer,
                 metrics: WorkerMetrics, batch_size: int, max_steps: int | None) -> None:
        self.rank = rank
        self.run_id = run_id
        self.transport = transport
        self.trainer = trainer
        self.metrics = metrics
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.version = 0
        self.workers = 1
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"asyncsync-compute-{rank}")

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` in the compute thread (vector math that must not block the loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def gradient(self, batch_size: int | None = None) -> tuple[StepResult, torch.Tensor]:
        """Compute one batch's gradient; returns it as a CPU copy safe to send."""

        def work() -> tuple[StepResult, torch.Tensor]:
            result = self.trainer.gradient(batch_size or self.batch_size)
            return result, self.trainer.gradient_copy()

        self._check_budget()
        start = self.metrics.now()
        result, grad = await self.in_thread(work)
        self._account(start, 1, result)
        return result, grad

    async def steps(self, count: int = 1, batch_size: int | None = None) -> StepResult:
        """Run `count` local SGD steps; returns their summed samples and time, last loss."""

        def work() -> StepResult:
            results = [self.trainer.local_step(batch_size or self.batch_size)
                       for _ in range(count)]
            return StepResult(results[-1].loss, sum(r.samples for r in results),
                              sum(r.compute_s for r in results))

        self._check_budget()
        start = self.metrics.now()
        result = await self.in_thread(work)
        self._account(start, count, result)
        return result

    def _account(self, start: float, steps: int, result: StepResult) -> None:
        self.metrics.computed(start, steps, result.samples, result.compute_s, result.loss,
                              self.trainer.last_factor, self.trainer.slowdown.overruns)

    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        """Send a gradient, delta or model; returns the reply's protocol meta."""
        header = {"kind": kind, "steps": steps, "samples": samples,
                  "base_version": self.version if base_version is None else base_version}
        reply, _ = await self.request("push", header, vector, meta)
        return dict(reply.get("meta", {}))

    async def pull(self, meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> tuple[torch.Tensor, int, dict[str, Any]]:
        """Fetch the global model: ``(vector, version, meta)``."""
        header = {"base_version": self.version if base_version is None else base_version}
        reply, vector = await self.request("pull", header, None, meta)
        if vector is None:
            raise RuntimeError("pull reply carried no model")
        return vector, int(reply["version"]), dict(reply.get("meta", {}))

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A protocol-specific control message; returns the reply's meta."""
        reply, _ = await self.request("query", {}, None, meta)
        return dict(reply.get("meta", {}))

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        """Make `vector` (global version `version`) the local model."""
        await self.in_thread(self.trainer.load, vector)
        self.version = version

    async def request(self, op: str, header: dict[str, Any], vector: torch.Tensor | None,
                      meta: dict[str, Any] | None) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Send one message with this worker's identity and stats; account its time."""
        header = {**header, "worker": self.rank, "run_id": self.run_id, "meta": meta or {},
                  "stats": self.metrics.snapshot()}
        start = self.metrics.now()
        began = time.monotonic()
        reply, out = await self.transport.request(op, header, vector)
        seconds = time.monotonic() - began
        held = float(reply.get("meta", {}).get("held_s", 0.0))
        self.metrics.transferred(op, start, seconds, held, tensor_bytes(vector),
                                 tensor_bytes(out), reply.get("version"))
        self.sync_bytes()
        if reply.get("stop"):
            raise RunStopped
        return reply, out

    def sync_bytes(self) -> None:
        """Take the byte totals from the transport, which counts every request exactly
        once even when several are in flight (heartbeats and headers included)."""
        self.metrics.stats.bytes_up = self.transport.bytes_up
        self.metrics.stats.bytes_down = self.transport.bytes_down

    def _check_budget(self) -> None:
        if self.max_steps is not None and self.metrics.stats.steps >= self.max_steps:
            raise RunStopped

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def tensor_bytes(vector: torch.Tensor | None) -> int:
    return 0 if vector is None else vector.numel() * vector.element_size()


def cycle_batches(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> BatchSource:
    """Adapt an iterable of ``(inputs, targets)`` (e.g. a DataLoader) to a batch source.

    The iterable's own batch size wins; protocols that resize batches need a callable.
    """
    iterator = iter(batches)

    def next_batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal iterator
        try:
            return next(iterator)
        except StopIteration:
            iterator = iter(batches)
            return next(iterator)

    return next_batch


class Worker:
    """One worker of a run.

    Args:
        rank: this worker's rank in ``0..workers-1``.
        server: the server's base URL, or a `Transport` (e.g. `LocalTransport`).
        model: the local model (same architecture as the server's).
        batches: a callable ``batch_size -> (inputs, targets)`` or an iterable of batches.
        protocol: a registered name or a `Protocol`; `protocol_params` its parameters.
        run_id: must match the server's.
        lr, momentum, weight_decay: local SGD settings.
        batch_size: default local batch size.
        slowdown: a factor (>= 1) or a compute profile from `asyncsync.hetero.compute`.
        max_steps: stop after this many local steps (None: until the server stops).
        link: emulated bandwidth/latency of this worker's link (HTTP transport only;
            give a `LocalTransport` its own `Link`).
        local_addr: the local address to connect from (HTTP transport only).
        token: the server's bearer token (HTTP transport only).
        heartbeat_s: seconds between heartbeats (keep well under the server's timeout).
        max_rejoins: give up after rejoining this many times.
        log_path: a JSONL file for this worker's spans and totals.
    """

    def __init__(
        self,
        rank: int,
        server: str | Transport,
        model: nn.Module,
        batches: BatchSource | Iterable[tuple[torch.Tensor, torch.Tensor]],
        protocol: str | Protocol = "bsp",
        *,
        protocol_params: Any = None,
        run_id: str = "run",
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        loss_fn: LossFn | None = None,
        batch_size: int = 32,
        slowdown: float | ComputeProfile = 1.0,
        device: str = "auto",
        max_steps: int | None = None,
        link: LinkSpec | None = None,
        local_addr: str | None = None,
        token: str | None = None,
        heartbeat_s: float = 2.0,
        max_rejoins: int = 20,
        log_path: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s}")
        self.heartbeat_s = heartbeat_s
        self.max_rejoins = max_rejoins
        self.rank = rank
        self.protocol = protocol if isinstance(protocol, Protocol) else get_protocol(protocol)
        self.protocol_params = (self.protocol.params() if protocol_params is None
                                else protocol_params)
        source = batches if callable(batches) else cycle_batches(batches)
        if isinstance(slowdown, int | float):
            slowdown = StaticSlowdown(slowdown)
        extra = {} if loss_fn is None else {"loss_fn": loss_fn}
        self.trainer = Trainer(model, source, lr, momentum, weight_decay, slowdown=slowdown,
                               device=device, **extra)
        shaped = Link(link, seed=rank) if link is not None and link.shaped else None
        self.transport = (HttpTransport(server, self.trainer.numel, link=shaped,
                                        local_addr=local_addr, token=token)
                          if isinstance(server, str) else server)
        self.metrics = WorkerMetrics(JsonlLog(log_path))
        self.ctx = WorkerContext(rank, run_id, self.transport, self.trainer, self.metrics,
                                 batch_size, max_steps)

    async def run(self) -> dict[str, Any]:
        """Join, run the protocol's loop until the run stops, leave; returns final totals.

        Heartbeats go out every `heartbeat_s` beside the loop. When the server no longer
        counts this worker (410: dropped after a timeout, or the server restarted from a
        checkpoint), refuses a request as out of step with the round (409), or the
        connection breaks mid-request, the worker rejoins, adopts the current global model
        and restarts its loop, at most `max_rejoins` times.
        """
        ctx = self.ctx
        rejoins = 0
        try:
            await self._join()
            self.metrics.start()
            self.trainer.slowdown.start()
            while True:
                try:
                    await self._session()
                except (RequestRejected, aiohttp.ClientError, ConnectionError) as exc:
                    if isinstance(exc, RequestRejected) and exc.status not in RESYNC_STATUSES:
                        raise
                    rejoins += 1
                    if rejoins > self.max_rejoins:
                        raise
                    self.metrics.log.write({"ev": "rejoin", "t": round(self.metrics.now(), 4),
                                            "reason": str(exc)[:200]})
                    await asyncio.sleep(min(0.1 * 2**rejoins, 2.0))
                    await self._join()
        except RunStopped:
            pass
        finally:
            ctx.sync_bytes()
            final = self.metrics.final()  # totals of the run, before the leave request
            with contextlib.suppress(Exception):  # the server may be gone; leaving is best effort
                await ctx.request("leave", {}, None, None)
            self.metrics.log.close()
            ctx.close()
            await self.transport.close()
        return final

    async def _join(self) -> None:
        reply, vector = await self.ctx.request("join", {}, None, None)
        if vector is None:
            raise RuntimeError("join reply carried no model")
        self.ctx.workers = int(reply.get("meta", {}).get("workers", 1))
        await self.ctx.adopt(vector, int(reply["version"]))

    async def _session(self) -> None:
        """The protocol's loop beside the heartbeats, until the loop ends or either fails.

        A heartbeat answered with ``stop`` only ends the heartbeats: the loop finishes the
        computation in progress and learns of the stop from its own next request, so no
        computed work goes unaccounted.
        """
        loop = asyncio.create_task(self.protocol.worker(self.protocol_params).run(self.ctx))
        beats = asyncio.create_task(self._heartbeats())
        try:
            await asyncio.wait({loop, beats}, return_when=asyncio.FIRST_COMPLETED)
            if beats.done() and not loop.done():
                beats.result()  # a failed heartbeat (e.g. 410) ends the session
                await loop
            loop.result()
        finally:
            for task in (loop, beats):
                task.cancel()
            await asyncio.gather(loop, beats, return_exceptions=True)

    async def _heartbeats(self) -> None:
        """Tell the server this worker is alive, also while it computes or waits."""
        header = {"worker": self.rank, "run_id": self.ctx.run_id}
        while True:
            await asyncio.sleep(self.heartbeat_s)
            reply, _ = await self.transport.request("heartbeat", header)
            if reply.get("stop"):
                return
