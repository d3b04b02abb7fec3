"""ParameterServer: the global model, its versions, evaluation and run control.

The server owns a `ParameterStore` (global vector ``w``, integer ``version``, server
optimizer) and a protocol's `ServerRule`. Every message goes through `ServerCore.handle`,
which validates it fully (run, worker, fields, finiteness) before the rule sees it; the
store replaces ``w`` on each commit instead of writing into it, so a rejected message never
changes the model and a pull reply can stream an old version while a new one is made.
Evaluation of the global model runs in its own thread at a fixed interval.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import logging
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from aiohttp import web
from torch import nn

from asyncsync.metrics import STAT_FIELDS, JsonlLog
from asyncsync.optim import FlatSGD
from asyncsync.protocols.base import Protocol, Pull, Push, Reply, ServerRule, get_protocol
from asyncsync.trainer import FlatModule, evaluate
from asyncsync.transport.http_server import make_app
from asyncsync.wire import Limits, WireError, require, require_count

T = TypeVar("T")
LOG = logging.getLogger("asyncsync.server")
INLINE_NUMEL = 1 << 18
"""Models up to this many elements (1 MB) do their vector math on the event loop."""
NONFINITE_WARN_AT = frozenset({3, 10, 100, 1000})
"""Counts of refused non-finite pushes at which the server warns about a worker."""
OPS = ("join", "push", "pull", "query", "heartbeat", "leave", "status", "stop")
Evaluator = Callable[[torch.Tensor], tuple[float, float]]


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or belongs to another run or model."""


class Stopped(Exception):
    """The run is over; the request is answered with ``stop = true``."""


@dataclass
class Commit:
    """One new version: who contributed, from which base versions."""

    version: int
    contributions: list[tuple[int, int]]


@dataclass
class StalenessStats:
    """Staleness of applied updates (version at apply time - base version)."""

    count: int = 0
    total: int = 0
    maximum: int = 0

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        self.maximum = max(self.maximum, value)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


class ParameterStore:
    """The global vector and its versions; the only way a rule changes the model.

    ``live`` holds the ranks currently in the run (joined, not left or lost); barriers
    count these rather than ``workers``, the configured size.
    """

    def __init__(self, vector: torch.Tensor, workers: int, optimizer: FlatSGD,
                 num_params: int | None = None) -> None:
        self.w = vector
        self.num_params = vector.numel() if num_params is None else num_params
        self.version = 0
        self.workers = workers
        self.optimizer = optimizer
        self.lock = asyncio.Lock()
        self.stopping = False
        self.commits: list[Commit] = []
        self.staleness = StalenessStats()
        self.live: set[int] = set()
        self.waiting: set[int] = set()
        self.blocked_s: dict[int, float] = {}
        self._changed = asyncio.Event()

    def current(self) -> Reply:
        return Reply(vector=self.w, version=self.version)

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Run vector arithmetic off the event loop, or inline for small models.

        Below `INLINE_NUMEL` elements an operation takes tens of microseconds, less than
        the hop to a thread and back.
        """
        if self.w.numel() <= INLINE_NUMEL:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def apply_gradient(self, gradient: torch.Tensor,
                             contributions: list[tuple[int, int]]) -> None:
        """``w <- w - optimizer.update(w, g)`` as a new version.

        Only the parameter slice takes the optimizer step; buffer slots of `gradient` hold
        buffer values (see `Trainer.gradient_copy`), which replace the global ones.
        """
        n = self.num_params

        def step() -> torch.Tensor:
            new = torch.empty_like(self.w)
            new[:n] = self.w[:n] - self.optimizer.update(self.w[:n], gradient[:n])
            new[n:] = gradient[n:]
            return new

        self.commit(await self.compute(step), contributions)

    def commit(self, vector: torch.Tensor, contributions: list[tuple[int, int]]) -> None:
        """Install `vector` as the next version and wake every waiter."""
        for _, base in contributions:
            self.staleness.add(self.version - base)
        self.w = vector
        self.version += 1
        self.commits.append(Commit(self.version, contributions))
        self.notify()

    def notify(self) -> None:
        """Wake coroutines blocked in `wait_for` so they re-check their condition."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, ready: Callable[[], bool], worker: int) -> None:
        """Block until `ready()` holds; raises `Stopped` when the run ends first.

        Time spent blocked is added to ``blocked_s[worker]``.
        """
        if ready():
            return
        self.waiting.add(worker)
        began = time.monotonic()
        try:
            while not ready():
                if self.stopping:
                    raise Stopped
                await self._changed.wait()
        finally:
            self.waiting.discard(worker)
            self.blocked_s[worker] = self.blocked_s.get(worker, 0.0) + time.monotonic() - began

    def stop(self) -> None:
        self.stopping = True
        self.notify()


@dataclass
class WorkerRecord:
    """What the server knows of one worker."""

    joined: bool = False
    left: bool = False
    lost: int = 0
    nonfinite: int = 0
    last_seen: float = 0.0
    state: str = "starting"
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class EvalPoint:
    t: float
    version: int
    accuracy: float
    loss: float


class ServerCore:
    """Transport-independent message handling; the HTTP app and the local transport call it."""

    def __init__(
        self,
        vector: torch.Tensor,
        protocol: Protocol,
        protocol_params: Any,
        workers: int,
        run_id: str,
        optimizer: FlatSGD,
        num_params: int | None = None,
        evaluator: Evaluator | None = None,
        eval_interval_s: float = 2.0,
        time_s: float | None = None,
        target_accuracy: float | None = None,
        stop_at_target: bool = False,
        events: JsonlLog | None = None,
        worker_timeout_s: float | None = 30.0,
        checkpoint_path: Path | None = None,
        checkpoint_s: float = 10.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if eval_interval_s <= 0:
            raise ValueError(f"eval_interval_s must be > 0, got {eval_interval_s}")
        if worker_timeout_s is not None and worker_timeout_s <= 0:
            raise ValueError(f"worker_timeout_s must be > 0, got {worker_timeout_s}")
        if checkpoint_s <= 0:
            raise ValueError(f"checkpoint_s must be > 0, got {checkpoint_s}")
        self.protocol = protocol
        self.run_id = run_id
        self.store = ParameterStore(vector.detach().to("cpu", copy=True).contiguous(),
                                    workers, optimizer, num_params)
        self.rule: ServerRule = protocol.server(protocol_params, self.store)
        self.limits = Limits(vector.numel())
        self.workers = [WorkerRecord() for _ in range(workers)]
        self.evaluator = evaluator
        self.eval_interval_s = eval_interval_s
        self.time_s = time_s
        self.target_accuracy = target_accuracy
        self.stop_at_target = stop_at_target
        self.events = events or JsonlLog(None)
        self.worker_timeout_s = worker_timeout_s
        self.checkpoint_path = checkpoint_path
        self.checkpoint_s = checkpoint_s
        self.evals: list[EvalPoint] = []
        self.t0: float | None = None
        self.stopped = False
        self.finished = asyncio.Event()
        self._all_joined = asyncio.Event()
        self._eval_pool = ThreadPoolExecutor(1, thread_name_prefix="asyncsync-eval")
        self._tasks: list[asyncio.Task[None]] = []

    # ---- run control -------------------------------------------------------------------
    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def _start(self, elapsed: float = 0.0) -> None:
        """Start the clock (at `elapsed` seconds when resuming) and the run's tasks."""
        self.t0 = time.monotonic() - elapsed
        if not elapsed:
            self.events.write({"event": "start", "t": 0.0, "protocol": self.protocol.name,
                               "workers": len(self.workers)})
        self._all_joined.set()
        self._tasks.append(asyncio.create_task(self._budget()))
        if self.evaluator is not None:
            self._tasks.append(asyncio.create_task(self._evaluations()))
        if self.worker_timeout_s is not None:
            self._tasks.append(asyncio.create_task(self._monitor(self.worker_timeout_s)))
        if self.checkpoint_path is not None:
            self._tasks.append(asyncio.create_task(self._checkpoints()))

    async def _budget(self) -> None:
        """Stop the run when its time budget is spent."""
        if self.time_s is not None:
            await asyncio.sleep(max(0.0, self.time_s - self.elapsed()))
            await self.stop()

    async def _monitor(self, timeout_s: float) -> None:
        """Drop live workers not heard from (requests or heartbeats) for `timeout_s`."""
        while not self.store.stopping:
            await asyncio.sleep(min(1.0, timeout_s / 4))
            now = time.monotonic()
            for rank in sorted(self.store.live):
                record = self.workers[rank]
                if now - record.last_seen > timeout_s:
                    record.lost += 1
                    record.state = "lost"
                    self.events.write({"event": "worker_lost", "t": round(self.elapsed(), 3),
                                       "worker": rank, "silent_s": round(now - record.last_seen,
                                                                         3)}, flush=True)
                    await self._drop(rank)

    async def _drop(self, worker: int) -> None:
        """Take `worker` out of the live set and let the rule finish rounds without it
        (not once the run is stopping: then no round is completed any more)."""
        self.store.live.discard(worker)
        if not self.store.stopping:
            await asyncio.shield(self.rule.on_leave(worker))
        self.store.notify()
        self._check_finished()

    async def _checkpoints(self) -> None:
        while not self.store.stopping:
            await asyncio.sleep(self.checkpoint_s)
            if not self.store.stopping:
                await self.checkpoint()

    async def checkpoint(self) -> None:
        """Write model, version, optimizer and rule state atomically (write, then rename)."""
        assert self.checkpoint_path is not None
        async with self.store.lock:
            arrays = {"w": self.store.w, "version": torch.tensor(self.store.version),
                      "elapsed": torch.tensor(self.elapsed(), dtype=torch.float64)}
            if self.store.optimizer.momentum_buffer is not None:
                arrays["momentum"] = self.store.optimizer.momentum_buffer.clone()
            arrays.update({f"rule.{k}": v.clone() for k, v in self.rule.state_dict().items()})
        await asyncio.to_thread(save_checkpoint, self.checkpoint_path, self.run_id, arrays)
        self.events.write({"event": "checkpoint", "t": round(self.elapsed(), 3),
                           "version": int(arrays["version"])}, flush=True)

    def resume(self, path: Path) -> None:
        """Continue from a checkpoint: model, version, optimizer, rule state and clock.

        Call before serving; workers then rejoin (no start barrier).
        """
        arrays = load_checkpoint(path, self.run_id)
        if arrays["w"].shape != self.store.w.shape:
            raise CheckpointError(f"checkpoint {path} holds {arrays['w'].numel()} parameters, "
                             f"the model has {self.store.w.numel()}")
        self.store.w = arrays["w"]
        self.store.version = int(arrays["version"])
        if "momentum" in arrays:
            self.store.optimizer.momentum_buffer = arrays["momentum"]
        self.rule.load_state_dict({k.removeprefix("rule."): v for k, v in arrays.items()
                                   if k.startswith("rule.")})
        elapsed = float(arrays["elapsed"])
        self.events.write({"event": "resume", "t": round(elapsed, 3),
                           "version": self.store.version}, flush=True)
        self._start(elapsed)

    async def _evaluations(self) -> None:
        """Evaluate every `eval_interval_s`; stop at the target when asked to."""
        assert self.t0 is not None
        next_eval = 0.0
        while not self.store.stopping:
            point = await self.evaluate()
            if (self.stop_at_target and self.target_accuracy is not None
                    and point.accuracy >= self.target_accuracy):
                await self.stop()
                return
            next_eval += self.eval_interval_s
            await asyncio.sleep(max(0.0, next_eval - self.elapsed()))

    async def evaluate(self) -> EvalPoint:
        """Evaluate the current global model in the evaluation thread and log it."""
        assert self.evaluator is not None
        vector, version, t = self.rule.eval_vector(), self.store.version, self.elapsed()
        loop = asyncio.get_running_loop()
        accuracy, loss = await loop.run_in_executor(self._eval_pool, self.evaluator, vector)
        point = EvalPoint(round(t, 3), version, accuracy, loss)
        self.evals.append(point)
        self.events.write({"event": "eval", "t": point.t, "version": version,
                           "accuracy": accuracy, "loss": loss})
        return point

    async def stop(self) -> None:
        """End the run: release every waiter, evaluate once more, log the totals."""
        if self.store.stopping:
            return
        self.store.stop()
        stopped_at = round(self.elapsed(), 3)
        if self.evaluator is not None and self.t0 is not None:
            await self.evaluate()
        if self.checkpoint_path is not None and self.t0 is not None:
            await self.checkpoint()
        stale = self.store.staleness
        self.events.write({"event": "stop", "t": stopped_at,
                           "versions": self.store.version, "updates": stale.count,
                           "mean_staleness": stale.mean, "max_staleness": stale.maximum},
                          flush=True)
        self.stopped = True
        self._check_finished()

    def _check_finished(self) -> None:
        if self.stopped and not self.store.live:
            self.finished.set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._eval_pool.shutdown(wait=True)
        self.events.close()

    # ---- messages ----------------------------------------------------------------------
    def body_limit(self, op: str) -> int:
        """The largest body an op may have: a model-sized tensor for pushes and queries."""
        if op in ("push", "query"):
            return self.limits.max_body_bytes
        return Limits(0).max_body_bytes

    def tensor_limits(self, op: str, header: dict[str, Any]) -> Limits | None:
        """Which tensor a request may carry, as the protocol's rule decides."""
        meta = header.get("meta", {})
        numel = self.rule.tensor_numel(op, meta if isinstance(meta, dict) else {})
        return None if numel is None else Limits(numel)

    async def handle(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Validate and answer one message; raises `WireError` for a 4xx."""
        if op not in OPS:
            raise WireError(404, f"unknown operation {op!r}")
        if op == "status":
            return self.status(), None
        run_id = require(header, "run_id", str)
        if run_id != self.run_id:
            raise WireError(409, f"wrong run {run_id!r}: this server runs {self.run_id!r}")
        if op == "stop":
            await self.stop()
            return {"stop": True}, None
        worker = require(header, "worker", int)
        if not 0 <= worker < len(self.workers):
            raise WireError(403, f"unknown worker {worker}: this run has ranks "
                                 f"0..{len(self.workers) - 1}")
        record = self.workers[worker]
        if op != "join" and worker not in self.store.live:
            if self.store.stopping:
                return {"stop": True}, None
            raise WireError(410, f"worker {worker} is not in the run (not joined, left or "
                                 f"dropped after a timeout): join first")
        meta = header.get("meta", {})
        if not isinstance(meta, dict):
            raise WireError(400, "field 'meta' must be a map")
        record.last_seen = time.monotonic()
        self._take_stats(record, header.get("stats"))
        if self.store.stopping:
            if op == "leave":
                await self._leave(worker)
            return {"stop": True}, None
        if op == "heartbeat":
            return {"meta": {}, "stop": False}, None
        started = time.monotonic()
        record.state = {"push": "pushing", "pull": "pulling"}.get(op, record.state)
        try:
            reply = await self._dispatch(op, worker, header, meta, vector)
        except Stopped:
            return {"stop": True}, None
        finally:
            record.last_seen = time.monotonic()
            if worker in self.store.live:
                record.state = "computing"
        reply.meta["held_s"] = round(time.monotonic() - started, 6)
        out: dict[str, Any] = {"meta": reply.meta, "stop": False}
        if reply.version is not None:
            out["version"] = reply.version
        return out, reply.vector

    async def _dispatch(self, op: str, worker: int, header: dict[str, Any],
                        meta: dict[str, Any], vector: torch.Tensor | None) -> Reply:
        if op == "join":
            return await self._join(worker)
        if op == "leave":
            await self._leave(worker)
            return Reply()
        if op == "query":
            return Reply(meta=await self.rule.on_query(worker, meta))
        base_version = require_count(header, "base_version")
        if op == "pull":
            return await self.rule.on_pull(Pull(worker, base_version, meta))
        kind = require(header, "kind", str)
        if kind not in self.rule.push_kinds:
            accepted = ", ".join(sorted(self.rule.push_kinds))
            raise WireError(400, f"push kind {kind!r} not accepted by {self.protocol.name} "
                                 f"(accepts: {accepted})")
        if vector is None:
            raise WireError(400, "push carries no tensor")
        push = Push(worker, base_version, kind, vector, require_count(header, "steps"),
                    require_count(header, "samples"), meta)
        if base_version > self.store.version:
            raise WireError(409, f"base version {base_version} is ahead of the server's "
                                 f"{self.store.version}")
        if not await self.store.compute(all_finite, vector):
            self._report_nonfinite(worker)
            raise WireError(422, "non-finite values (NaN or Inf) in the pushed tensor")
        return Reply(meta=await self.rule.on_push(push))

    def _report_nonfinite(self, worker: int) -> None:
        """Count a refused NaN/Inf push; warn when a worker keeps sending them."""
        record = self.workers[worker]
        record.nonfinite += 1
        self.events.write({"event": "nonfinite_push", "t": round(self.elapsed(), 3),
                           "worker": worker, "count": record.nonfinite})
        if record.nonfinite in NONFINITE_WARN_AT:
            LOG.warning("worker %d has sent %d non-finite updates (all refused); its "
                        "training has probably diverged", worker, record.nonfinite)

    async def _join(self, worker: int) -> Reply:
        """First joins wait for everyone (the start barrier); later ones rejoin at once."""
        record = self.workers[worker]
        rejoin = self.t0 is not None
        if rejoin and worker in self.store.live:  # it restarted before being dropped
            await self._drop(worker)
        record.joined, record.left = True, False
        self.store.live.add(worker)
        if rejoin:
            await self.rule.on_join(worker)
            self.store.notify()
        elif all(w.joined for w in self.workers):
            self._start()
        while not self._all_joined.is_set():
            if self.store.stopping:
                raise Stopped
            await self._all_joined.wait()
        self.events.write({"event": "rejoin" if rejoin else "join",
                           "t": round(self.elapsed(), 3), "worker": worker,
                           "version": self.store.version})
        reply = self.store.current()
        reply.meta["workers"] = len(self.workers)
        return reply

    async def _leave(self, worker: int) -> None:
        record = self.workers[worker]
        record.left = True
        record.state = "left"
        await self._drop(worker)

    @staticmethod
    def _take_stats(record: WorkerRecord, stats: object) -> None:
        if isinstance(stats, dict):
            record.stats = {k: float(v) for k, v in stats.items()
                            if k in STAT_FIELDS and isinstance(v, int | float)
                            and not isinstance(v, bool)}

    def status(self) -> dict[str, Any]:
        """A read-only snapshot for dashboards."""
        latest = self.evals[-1] if self.evals else None
        workers = []
        for rank, record in enumerate(self.workers):
            stats = record.stats
            wall = stats.get("wall_s", 0.0)
            state = "waiting" if rank in self.store.waiting else record.state
            workers.append({
                "rank": rank, "state": state,
                "steps": int(stats.get("steps", 0)),
                "samples_per_s": stats.get("samples", 0.0) / wall if wall > 0 else 0.0,
                "compute_proportion": stats.get("compute_s", 0.0) / wall if wall > 0 else 0.0,
                "bytes_up": int(stats.get("bytes_up", 0)),
                "bytes_down": int(stats.get("bytes_down", 0)),
                "loss": stats.get("loss", math.nan),
                "factor": stats.get("factor", 1.0),
                "overruns": int(stats.get("overruns", 0)),
                "nonfinite": record.nonfinite,
                "lost": record.lost,
            })
        return {
            "protocol": self.protocol.name, "run_id": self.run_id,
            "version": self.store.version, "elapsed_s": self.elapsed(),
            "time_s": self.time_s, "started": self.t0 is not None,
            "stopping": self.store.stopping, "finished": self.finished.is_set(),
            "accuracy": latest.accuracy if latest else None,
            "best_accuracy": max((p.accuracy for p in self.evals), default=None),
            "workers": workers,
        }


def all_finite(vector: torch.Tensor, chunk: int = 1 << 20) -> bool:
    """No NaN or Inf in `vector`, checked a slice at a time (no model-sized mask)."""
    return all(bool(torch.isfinite(vector[i : i + chunk]).all())
               for i in range(0, vector.numel(), chunk))


def save_checkpoint(path: Path, run_id: str, arrays: dict[str, torch.Tensor]) -> None:
    """Write tensors as an uncompressed ``.npz`` (no pickle), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    named: dict[str, Any] = {k: v.numpy() for k, v in arrays.items()}
    with tmp.open("wb") as handle:
        np.savez(handle, run_id=np.array(run_id), **named)
    os.replace(tmp, path)


def load_checkpoint(path: Path, run_id: str) -> dict[str, torch.Tensor]:
    """Read a checkpoint written by `save_checkpoint` for the same run."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files if k != "run_id"}
            saved_run = str(data["run_id"])
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if saved_run != run_id:
        raise CheckpointError(f"checkpoint {path} belongs to run {saved_run!r}, not {run_id!r}")
    return arrays


def make_evaluator(model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor) -> Evaluator:
    """An evaluator owning a private copy of `model` that loads each vector it is given."""
    holder = FlatModule(copy.deepcopy(model), torch.device("cpu"))

    def run(vector: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            holder.flat.copy_(vector)
        return evaluate(holder.module, test_x, test_y)

    return run


def build_core(
    model: nn.Module,
    protocol: str | Protocol,
    workers: int,
    *,
    protocol_params: Any = None,
    run_id: str = "run",
    lr: float = 0.05,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    test_data: tuple[torch.Tensor, torch.Tensor] | None = None,
    **options: Any,
) -> ServerCore:
    """A `ServerCore` whose initial global model is `model`'s current parameters."""
    proto = protocol if isinstance(protocol, Protocol) else get_protocol(protocol)
    params = proto.params() if protocol_params is None else protocol_params
    flat = FlatModule(copy.deepcopy(model), torch.device("cpu"))
    evaluator = make_evaluator(model, *test_data) if test_data is not None else None
    return ServerCore(flat.flat, proto, params, workers, run_id,
                      FlatSGD(lr, momentum, weight_decay), flat.num_params,
                      evaluator=evaluator, **options)


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ParameterServer:
    """A `ServerCore` served over HTTP on an aiohttp `AppRunner` (for embedding and the CLI).

    Binds to 127.0.0.1 unless `host` says otherwise; port 0 picks a free port (see `url`).
    With a `token`, every request must carry it as a bearer token; listening beyond
    loopback without one logs a warning. Other keyword arguments go to `build_core`.
    """

    def __init__(self, model: nn.Module, protocol: str | Protocol, workers: int, *,
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 **options: Any) -> None:
        self.core = build_core(model, protocol, workers, **options)
        self.host = host
        self.port = port
        self.token = token
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Start listening; returns the base URL."""
        if self.token is None and not is_loopback(self.host):
            LOG.warning("listening on %s without a token: anyone who can reach it may push "
                        "updates (set ASYNCSYNC_TOKEN)", self.host)
        self._runner = web.AppRunner(make_app(self.core, self.token), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        """End the run now (workers get ``stop`` on their next request)."""
        await self.core.stop()

    async def wait_finished(self, grace_s: float = 30.0) -> None:
        """Wait for the run to stop and every worker to leave (at most `grace_s` after stop)."""
        while not self.core.store.stopping:
            await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(self.core.finished.wait(), grace_s)
        except TimeoutError:
            self.core.events.write({"event": "leave_timeout", "t": round(self.core.elapsed(), 3)})

    async def close(self) -> None:
        await self.core.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.core.close()

    async def __aenter__(self) -> ParameterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
