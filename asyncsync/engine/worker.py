"""A worker: joins the run, runs its protocol's loop through a `WorkerContext`, leaves.

The context implements the SDK's `Context` port. Every local computation goes through
the worker's compute seam (real mode: one compute thread, slowness padded on the loop),
every message through its transport; both are timed on the one clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from asyncsync.clock import now, sleep
from asyncsync.engine.channel import Dial, Transport, checked_transport, connect
from asyncsync.engine.compute import Charged, ThreadedWorkerSeam, WorkerSeam, enter_loop, leave_loop
from asyncsync.engine.presence import Presence, StopLatch, WentOffline
from asyncsync.engine.settings import require_int
from asyncsync.engine.work import LocalWork
from asyncsync.hetero.availability import OnlineTimes
from asyncsync.hetero.compute import ComputeProfile, StaticSlowdown
from asyncsync.hetero.network import Link
from asyncsync.protocols.base import (
    NotInRun,
    OutOfStep,
    Protocol,
    RunStopped,
    Unacceptable,
    get_protocol,
)
from asyncsync.protocols.ports import StepResult
from asyncsync.runlog.metrics import JsonlLog, WorkerMetrics
from asyncsync.runlog.schema import HELD, Kind, record
from asyncsync.training.trainer import (
    BatchSource,
    Computed,
    LossFn,
    Trainer,
    cycle_batches,
    model_numel,
)
from asyncsync.wire.codecs import COMPRESSED_KINDS, Compressor

T = TypeVar("T")
RESYNC = (OutOfStep, NotInRun)
"""Refusals after which a worker rejoins and restarts its loop: the server no longer counts
it (dropped after a timeout, or restarted), or its request no longer fits the protocol's
state (e.g. it raced a membership change)."""
LOG = logging.getLogger("asyncsync.worker")
JOIN_WAIT_S = 120.0
"""How long a join is retried while another session of the rank is live (before the start)."""


class WorkerContext:
    """The engine's implementation of the SDK's `Context` port (see there for the verbs)."""

    def __init__(self, rank: int, run_id: str, transport: Transport, trainer: Trainer,
                 seam: WorkerSeam, metrics: WorkerMetrics, batch_size: int,
                 max_steps: int | None, compressor: Compressor | None = None) -> None:
        self.rank, self.run_id = rank, run_id
        self.numel = trainer.numel
        self.batch_size = batch_size
        self.lr = trainer.optimizer.lr
        self.shard_size = trainer.shard_size  # known when the batches are a BatchSampler
        self.version = 0
        self.workers = 1
        self._transport, self._trainer = transport, trainer
        self._seam, self._metrics = seam, metrics
        self._max_steps = max_steps
        self._session = ""  # the secret of this worker's session, from its join reply
        self._compressor = compressor  # encodes gradient and delta pushes (None: float32)
        self._requests = 0  # under way (a step may hold the event loop only when none is)
        self.stopped = StopLatch(rank)  # after RunStopped: RunStopped, then LoopWentOn
        self._gradients: dict[tuple[int, bool], LocalWork] = {}  # by batch size and copy
        seam.watch(lambda: self._requests > 0)

    # ---- computation -------------------------------------------------------------------
    async def gradient(self, batch_size: int | None = None, *, copy: bool = True,
                       ) -> tuple[StepResult, torch.Tensor]:
        size = batch_size or self.batch_size
        self._check_budget()
        start = self._metrics.now()
        work = self._gradients.get((size, copy)) or self._gradients.setdefault(
            (size, copy), LocalWork(self._trainer, size, copy=copy))  # made once a size
        charged = await self._seam.step(work, batch=size)
        computed, grad = charged.result
        assert grad is not None  # a gradient's work hands back its vector
        return self._account(start, [charged], [computed]), grad

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        if count < 1:
            raise ValueError(f"steps: count must be >= 1, got {count}")
        center, rho = proximal if proximal is not None else (None, 0.0)
        size = batch_size or self.batch_size
        work = LocalWork(self._trainer, size, local=True, center=center, rho=rho,
                         correction=correction)
        self._check_budget(count)
        start = self._metrics.now()
        charges: list[Charged] = []
        for _ in range(count):
            charges.append(await self._seam.step(work, batch=size))
        return self._account(start, charges, [c.result[0] for c in charges])

    def _account(self, start: float, charges: list[Charged], results: list[Computed]
                 ) -> StepResult:
        out = StepResult(results[-1].loss, sum(r.samples for r in results),
                         sum(c.seconds for c in charges))
        self._metrics.computed(start, len(results), out.samples, out.compute_s, out.loss,
                               charges[-1].factor, self._seam.overruns)
        return out

    async def snapshot(self) -> torch.Tensor:
        return await self._seam.math(self._trainer.vector_copy)

    async def delta_since(self, anchor: torch.Tensor, start: int = 0,
                          stop: int | None = None) -> torch.Tensor:
        return await self._seam.math(self._trainer.delta_since, anchor, start, stop)

    async def delta_and_snapshot(self, anchor: torch.Tensor) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        def split() -> tuple[torch.Tensor, torch.Tensor]:
            current = self._trainer.vector_copy()
            return current - anchor, current

        return await self._seam.math(split)

    async def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                         stop: int | None = None) -> None:
        await self._seam.math(self._trainer.mix_toward, target, weight, start, stop)

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        self._seam.defer(self._trainer.load, vector)  # before the next computation
        self.version = version

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._seam.math(fn, *args)

    # ---- messages ----------------------------------------------------------------------
    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        header, vector = await self._push_header(kind, vector, steps, samples, base_version)
        reply, _ = await self._request("push", header, vector, meta)
        return dict(reply.get("meta", {}))

    async def push_and_pull(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                            meta: dict[str, Any] | None = None,
                            ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        header, vector = await self._push_header(kind, vector, steps, samples, None)
        header["then_pull"] = True
        request = self._request("push", header, vector, meta, label="exchange")
        del vector  # not held while the pull waits (e.g. to be sampled again)
        reply, pulled = await request
        if pulled is None:
            raise RuntimeError("exchange reply carried no model")
        return pulled, int(reply["version"]), dict(reply.get("meta", {}))

    async def _push_header(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                           base_version: int | None,
                           ) -> tuple[dict[str, Any], torch.Tensor]:
        """A push's header, and its vector as it travels (encoded when compressed)."""
        header: dict[str, Any] = {
            "kind": kind, "steps": steps, "samples": samples,
            "base_version": self.version if base_version is None else base_version}
        if self._compressor is not None and kind in COMPRESSED_KINDS:
            vector, header["codec"] = await self._seam.math(
                self._compressor.encode, kind, vector, self._session,
                vector.numel() == self.numel, self.numel - self._trainer.params.num_params)
        return header, vector

    async def pull(self, meta: dict[str, Any] | None = None, base_version: int | None = None
                   ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        header = {"base_version": self.version if base_version is None else base_version}
        reply, vector = await self._request("pull", header, None, meta)
        if vector is None:
            raise RuntimeError("pull reply carried no model")
        return vector, int(reply["version"]), dict(reply.get("meta", {}))

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        reply, _ = await self._request("query", {}, None, meta)
        return dict(reply.get("meta", {}))

    def open(self, session: str) -> None:
        """Take the session secret of a join reply (sent with every later request)."""
        self._session = session

    @property
    def joined(self) -> bool:  # a join of this worker was answered: it holds its secret
        return bool(self._session)

    def heartbeat_header(self) -> dict[str, Any]:
        return {"worker": self.rank, "run_id": self.run_id, "session": self._session}

    async def _request(self, op: str, header: dict[str, Any], vector: torch.Tensor | None,
                       meta: dict[str, Any] | None, label: str | None = None,
                       ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Send one message with this worker's identity and stats; account its time (logged
        as `label`, the operation by default)."""
        self.stopped.check(op)
        start = self._metrics.now()
        began = now()
        self._requests += 1
        up = self._transport.wire_bytes(vector)
        try:
            # The header is built in the call, so the transport holds its only reference
            # and may drop it once encoded (100,000 simulated workers each have one in
            # flight); so is the vector, once sent.
            pending = self._transport.request(
                op, {**header, "worker": self.rank, "run_id": self.run_id,
                     "meta": meta or {}, "stats": self._metrics.snapshot(),
                     "session": self._session}, vector)
            del vector
            reply, out = await pending
        finally:
            self._requests -= 1
        held = float(reply.get("meta", {}).get(HELD, 0.0))
        self._metrics.transferred(label or op, start, now() - began, held, up,
                                  self._transport.wire_bytes(out), reply.get("version"))
        self._metrics.take_bytes(self._transport.bytes_up, self._transport.bytes_down)
        if reply.get("stop"):
            self.stopped.stop(op)
        return reply, out

    def _check_budget(self, count: int = 1) -> None:  # a call runs whole or not at all
        if self._max_steps is not None and self._metrics.stats.steps + count > self._max_steps:
            self.stopped.stop("computation")


class Worker:
    """One worker of a run, talking to its server through `transport`.

    Args:
        rank: this worker's rank in ``0..workers-1``.
        transport: how it reaches the server: a `LocalTransport` in one process, or an
            HTTP one (`Worker.connect` dials a URL).
        model: the local model (same architecture as the server's).
        batches: a callable ``batch_size -> (inputs, targets)`` or an iterable of batches
            (not for protocols that resize batches, e.g. lbbsp); a `ShardBatchSource` (a
            `BatchSampler`) tells the loop its shard's size (`Context.shard_size`).
        protocol: a registered name or a `Protocol`; `protocol_params` its parameters.
        run_id: must match the server's.
        lr: local SGD's learning rate (`momentum`, `weight_decay`: its momentum and decay).
        batch_size: default local batch size.
        max_steps: at most this many local steps (None: until the server stops).
        heartbeat_s: seconds between heartbeats (keep well under the server's timeout);
            None: none, for a worker that cannot fall silent (in the server's process).
        max_rejoins: give up after rejoining this many times.
        log_path: a JSONL file for this worker's spans and totals.
        seam: how it computes and what a step is charged (default: a compute thread, no
            slowdown; see `asyncsync.engine.compute`).
        compressor: encodes this worker's gradient and delta pushes (None: float32; see
            `asyncsync.wire.codecs`).
        availability: when this worker is online, in seconds since the run's start (None:
            throughout; see `asyncsync.hetero.availability`).
    """

    def __init__(
        self,
        rank: int,
        transport: Transport,
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
        device: str = "auto",
        max_steps: int | None = None,
        heartbeat_s: float | None = 2.0,
        max_rejoins: int = 20,
        log_path: Path | None = None,
        seam: WorkerSeam | None = None,
        compressor: Compressor | None = None,
        availability: OnlineTimes | None = None,
    ) -> None:
        self.transport = checked_transport(transport)
        if heartbeat_s is not None and not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s}")
        for name, value, least in (("rank", rank, 0), ("batch_size", batch_size, 1),
                                   ("max_steps", 1 if max_steps is None else max_steps, 1),
                                   ("max_rejoins", max_rejoins, 0)):
            require_int(name, value, least)
        self.heartbeat_s, self.max_rejoins, self.rank = heartbeat_s, max_rejoins, rank
        self._ran = False  # a Worker runs once
        self.protocol = protocol if isinstance(protocol, Protocol) else get_protocol(protocol)
        self.protocol_params = self.protocol.make_params(protocol_params)
        if not callable(batches) and self.protocol.resizes_batches:
            raise ValueError(f"{self.protocol.name} assigns batch sizes, which an iterable of "
                             "fixed batches cannot follow: pass a callable batch source "
                             "(batch_size -> (inputs, targets))")
        source = batches if callable(batches) else cycle_batches(batches)
        self.trainer = Trainer(model, source, lr, momentum, weight_decay, device=device,
                               **({} if loss_fn is None else {"loss_fn": loss_fn}))
        self.seam = seam or ThreadedWorkerSeam(StaticSlowdown(1.0), f"asyncsync-compute-{rank}")
        self.metrics = WorkerMetrics(JsonlLog(log_path))
        self.presence = Presence(availability, self.metrics)
        self.ctx = WorkerContext(rank, run_id, self.transport, self.trainer, self.seam,
                                 self.metrics, batch_size, max_steps, compressor)

    @classmethod
    def connect(cls, rank: int, url: str, model: nn.Module,
                batches: BatchSource | Iterable[tuple[torch.Tensor, torch.Tensor]],
                protocol: str | Protocol = "bsp", *, link: Link | None = None,
                local_addr: str | None = None, token: str | None = None,
                tls: ssl.SSLContext | None = None, slowdown: float | ComputeProfile = 1.0,
                channel: str = "stream", **options: Any) -> Worker:
        """A worker of the server at `url` (e.g. ``http://127.0.0.1:8470``).

        Args:
            link: an emulated link for its messages (`asyncsync.hetero.network.Link`).
            local_addr: the local address to connect from.
            token: the server's bearer token.
            tls: the context that verifies an https server (None: the system's store).
            slowdown: a factor (>= 1) or a compute profile (`asyncsync.hetero.compute`).
            channel: ``stream`` (frames on upgraded connections) or ``http`` (a POST per
                request); see `asyncsync.engine.channel.CHANNELS`.
            options: the keyword arguments of `Worker` (all but `seam`).
        """
        profile = StaticSlowdown(slowdown) if isinstance(slowdown, int | float) else slowdown
        dial = Dial(model_numel(model), link, local_addr, token, tls, channel)
        return cls(rank, connect(url, dial), model, batches, protocol,
                   seam=ThreadedWorkerSeam(profile, f"asyncsync-compute-{rank}"), **options)

    async def run(self) -> dict[str, Any]:
        """Join, run the protocol's loop until the run stops, leave; returns final totals.

        Heartbeats go out every `heartbeat_s` beside the loop. When the server no longer
        counts this worker (`NotInRun`: dropped after a timeout, or the server restarted
        from a checkpoint), refuses a request as `OutOfStep`, or the connection breaks
        mid-request, the worker rejoins, adopts the current global model and restarts its
        loop, at most `max_rejoins` times. A request refused as `Unacceptable` (e.g. a push
        completing a buffer whose result overflows) is logged (event ``refused``), counted
        (``refused`` in the totals) and re-synced the same way, without limit: others'
        pushes never end this worker. Outside its `availability` intervals the worker
        computes and sends nothing: its loop is cancelled, it leaves, and it rejoins when
        it is next online (it ends when it never is again).
        """
        if self._ran:
            raise RuntimeError("a Worker runs once: make a new one (Worker.connect) to rejoin")
        self._ran, rejoins, refused = True, 0, 0
        enter_loop()
        try:
            await self._join()
            self.metrics.start()
            self.seam.start()
            while True:
                try:
                    await self.presence.session(self._session)
                except WentOffline:
                    await self.presence.absence(lambda: self.ctx._request("leave", {}, None, None))
                    await self._join()
                except Unacceptable as exc:  # e.g. others' deltas made the result overflow
                    refused += 1
                    self.metrics.log.write(record(Kind.REFUSED, t=round(self.metrics.now(), 4),
                                                  count=refused, reason=str(exc)[:200]))
                    if math.log10(refused).is_integer():
                        LOG.warning("worker %d: %d requests refused, the last: %s; it "
                                    "re-syncs and goes on", self.rank, refused, exc)
                    await self._join()
                except (*RESYNC, OSError) as exc:
                    rejoins += 1
                    if rejoins > self.max_rejoins:
                        raise
                    self.metrics.log.write(record(Kind.REJOIN, t=round(self.metrics.now(), 4),
                                                  reason=str(exc)[:200]))
                    await asyncio.sleep(min(0.1 * 2**rejoins, 2.0))
                    await self._join()
        except RunStopped:
            pass
        finally:
            self.metrics.take_bytes(self.transport.bytes_up, self.transport.bytes_down)
            final = self.metrics.final()  # totals of the run, before the leave request
            final["refused"] = refused
            if self.ctx.joined:  # best effort (the server may be gone); not if never joined
                with contextlib.suppress(Exception):
                    await self.ctx._request("leave", {}, None, None)
            self.metrics.log.close()
            self.seam.close()
            await self.transport.close()
            leave_loop()
        return final

    async def _join(self) -> None:
        """Join (or re-sync) and adopt the global model; a join refused while an earlier
        session of this rank is live (a restart) is retried for `JOIN_WAIT_S` at most."""
        waited = 0.0
        while True:
            try:
                reply, vector = await self.ctx._request(  # the server checks they fit
                    "join", {"protocol": self.protocol.name, "numel": self.ctx.numel,
                             **self.presence.join_fields()}, None, None)
                break
            except OutOfStep:
                if waited >= JOIN_WAIT_S:
                    raise
                await asyncio.sleep(1.0)
                waited += 1.0
        if vector is None:
            raise RuntimeError("join reply carried no model")
        self.ctx.workers = int(reply.get("meta", {}).get("workers", 1))
        self.ctx.open(str(reply.get("meta", {}).get("session", "")))
        await self.ctx.adopt(vector, int(reply["version"]))

    async def _session(self) -> None:
        """The protocol's loop beside the heartbeats, until either fails (a loop that
        returns is an error). A heartbeat answered with ``stop`` only ends the heartbeats:
        the loop learns of the stop from its own next request, so no computed work goes
        unaccounted."""
        loop = asyncio.create_task(self.protocol.worker(self.protocol_params).run(self.ctx))
        beats = (None if self.heartbeat_s is None
                 else asyncio.create_task(self._heartbeats(self.heartbeat_s)))
        tasks = {loop, *self.presence.watch(), *([beats] if beats else [])}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if not loop.done() and beats is not None and beats.done():
                beats.result()  # a failed heartbeat (e.g. not in the run) ends the session
                await loop
            elif not loop.done():
                raise WentOffline  # (the watch ended first)
            loop.result()
            raise RuntimeError(f"{self.protocol.name}: its worker loop returned; a loop runs "
                               "until the run ends (a request raises RunStopped)")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeats(self, every_s: float) -> None:
        """Tell the server this worker is alive, also while it computes or waits."""
        while True:
            await sleep(every_s)
            reply, _ = await self.transport.request("heartbeat", self.ctx.heartbeat_header())
            if reply.get("stop"):
                return
