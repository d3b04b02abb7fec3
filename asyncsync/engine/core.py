"""The server core: validates every request, enforces membership, dispatches to the rule.

Transport-independent: the HTTP app and the in-process transport both call
`ServerCore.handle`, which validates a message fully (run, worker, fields, finiteness)
before the protocol's rule sees it and raises the SDK's refusals for anything it refuses.
A compressed push is decoded first (`asyncsync.wire.codecs`) and then checked like any.

A push whose header says ``then_pull: true`` is a fused exchange: once the rule has taken
the push, the request goes on as a pull with the same base version and meta, and its
reply is the pull's (the push's reply meta under ``meta["push"]``). Barrier protocols,
whose push is always followed by a pull of the next model, save a request per step.

Each push's and query's number (``seq``) is taken once per session, for every protocol,
just before the rule sees the request (`membership`): a replay is a 409 and changes
nothing. A join without a secret takes its rank's session over (`membership`): in the run
the rule sees the old one leave, as after a timeout; at the start barrier the held join gets 403.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asyncsync.clock import now
from asyncsync.engine.checkpoint import CheckpointError, model_fingerprint
from asyncsync.engine.compute import ServerSeam
from asyncsync.engine.evaluation import EvalPoint, Evaluator, make_evaluator
from asyncsync.engine.lifecycle import RunLifecycle
from asyncsync.engine.membership import WorkerRecord
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import (
    BadRequest,
    Forbidden,
    NotInRun,
    OutOfStep,
    Protocol,
    Pull,
    Push,
    Reply,
    RunStopped,
    ServerRule,
    Unacceptable,
    all_finite,
    brief,
    get_protocol,
    require,
    require_count,
)
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.schema import HELD, Kind, record
from asyncsync.training.buffers import VectorPool
from asyncsync.training.optim import FlatSGD
from asyncsync.training.trainer import FlatModule
from asyncsync.wire.codecs import COMPRESSED_KINDS, decode
from asyncsync.wire.frames import reply_meta

LOG = logging.getLogger("asyncsync.server")
OPS = ("join", "push", "pull", "query", "heartbeat", "leave", "status", "stop")


class UnknownOperation(BadRequest):
    """The request names no operation of this server."""


class ServerCore:
    """A protocol's rule behind request validation, membership and the run's lifecycle.

    Attributes:
        store: the global model; rule: the protocol's server half; run: the lifecycle;
        workers: one record per rank; finished: set once stopped and every worker left.
    """

    def __init__(self, vector: torch.Tensor, protocol: Protocol, protocol_params: Any,
                 workers: int, settings: ServerSettings, *, num_params: int | None = None,
                 evaluator: Evaluator | None = None, events: JsonlLog | None = None,
                 seam: ServerSeam | None = None, fingerprint: str = "",
                 frozen: Sequence[slice] = ()) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.protocol = protocol
        self.settings = settings
        self.run_id = settings.run_id
        vector = vector.detach().to("cpu", copy=True).contiguous()
        optimizer = FlatSGD(settings.lr, settings.momentum, settings.weight_decay)
        self.store = ParameterStore(vector, workers, optimizer, num_params, seam, frozen)
        self.rule: ServerRule = protocol.server(protocol_params, self.store)
        self.store.keep_state_of(self.rule)
        self.workers = [WorkerRecord() for _ in range(workers)]
        self.events = events or JsonlLog(None)
        self.run = RunLifecycle(settings, self.store, self.rule, self.events, evaluator,
                                on_stopped=self._check_finished,
                                fingerprint=fingerprint or f"vector:{vector.numel()}")
        self.finished = asyncio.Event()
        self._all_joined = asyncio.Event()
        self._joined = 0  # workers that have joined at least once

    @property
    def buffers(self) -> VectorPool:
        """The pool transports receive pushes into (see `asyncsync.training.buffers`)."""
        return self.store.buffers

    @property
    def evals(self) -> list[EvalPoint]:
        return self.run.evals

    def elapsed(self) -> float:
        return self.run.elapsed()

    # ---- run control -------------------------------------------------------------------
    def _start(self, elapsed: float = 0.0) -> None:
        if not elapsed:
            self.run.log(Kind.START, protocol=self.protocol.name, workers=len(self.workers))
        self._all_joined.set()
        monitors = [] if self.settings.worker_timeout_s is None else [self._monitor]
        self.run.start(elapsed, *monitors)

    def resume(self, path: Path) -> None:
        """Continue from the checkpoint at `path`: model, version, optimizer, rule state and
        clock. Call before serving; workers then rejoin. Anything that does not fit (a
        rule's state included) is a `CheckpointError`."""
        try:
            elapsed = self.run.restore(path)
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this run's "
                                  f"{self.protocol.name} server: {exc}") from None
        self.events.write(record(Kind.RESUME, t=round(elapsed, 3), version=self.store.version),
                          flush=True)
        self._start(elapsed)

    async def _monitor(self) -> None:
        """Drop live workers not heard from (requests or heartbeats) for the timeout."""
        timeout_s = self.settings.worker_timeout_s
        assert timeout_s is not None
        while not self.store.stopping:
            await asyncio.sleep(min(1.0, timeout_s / 4))
            now = self.store.now()
            for rank in sorted(self.store.live):
                if now - self.workers[rank].last_seen > timeout_s:
                    await self._lose(rank, silent_s=round(now - self.workers[rank].last_seen, 3))

    async def _lose(self, worker: int, **why: object) -> None:
        """Drop a live worker that is gone: timed out, or taken over by a restarted copy."""
        record = self.workers[worker]
        record.lost += 1
        record.state = "lost"
        self.run.log(Kind.WORKER_LOST, flush=True, worker=worker, **why)
        await self._drop(worker)

    async def _drop(self, worker: int) -> None:
        """Take `worker` out of the live set and let the rule finish rounds without it
        (not once the run is stopping: then no round is completed any more)."""
        self.store.drop(worker)
        if not self.store.stopping:
            await asyncio.shield(self.rule.on_leave(worker))
        self.store.notify()
        self._check_finished()

    async def stop(self) -> None:
        """End the run: release every waiter, evaluate once more, log the totals."""
        await self.run.stop()

    def _check_finished(self) -> None:
        if self.run.stopped and not self.store.live:
            self.finished.set()

    async def close(self) -> None:
        """Release the run's tasks, seam and log; then raise the error that ended the run,
        if one of its periodic tasks failed."""
        await self.run.close()
        self.store.seam.close()
        self.events.close()
        if self.run.failure is not None:
            raise self.run.failure

    # ---- messages ----------------------------------------------------------------------
    def tensor_numel(self, op: str, header: dict[str, Any]) -> int | None:
        """How many elements the tensor of a request must have (None: no tensor), as the
        protocol's rule decides; its refusals are raised."""
        check_op(op)
        meta = header.get("meta", {})
        return self.rule.tensor_numel(op, meta if isinstance(meta, dict) else {})

    async def handle(self, op: str, header: dict[str, Any], vector: torch.Tensor | None,
                     finite: bool | None = None,
                     ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Validate and answer one message; raises a `Refused` for anything refused.

        `finite` says whether `vector` holds no NaN or Inf, when the transport checked it
        while receiving (None: the core checks it).
        """
        check_op(op)
        if op == "status":
            return self.status(), None
        worker = self.identify(op, header)
        if op == "stop":
            await self.stop()
            return {"stop": True}, None
        if worker is None:
            return {"stop": True}, None
        record = self.workers[worker]
        if op in ("push", "pull", "query") and not self._all_joined.is_set():
            raise OutOfStep(f"the run has not started ({self._joined} "
                            f"of {len(self.workers)} workers joined): wait for the join reply")
        meta = header.get("meta", {})
        if not isinstance(meta, dict):
            raise BadRequest("field 'meta' must be a map")
        record.last_seen = self.store.now()
        record.take_stats(header.get("stats"))
        if self.store.stopping:
            if op == "leave":
                await self._leave(worker)
            return {"stop": True}, None
        if op == "heartbeat":
            return {"meta": {}, "stop": False}, None
        started = now()  # not the run's clock: a join's wait spans the run's start
        record.state = {"push": "pushing", "pull": "pulling"}.get(op, record.state)
        try:
            dispatch, vector = self._dispatch(op, worker, header, meta, vector, finite), None
            reply = await dispatch  # (the vector is not held here while a pull waits)
        except RunStopped:  # (held, e.g. at a barrier, until the run stopped: say how long)
            return {"meta": {HELD: round(now() - started, 6)}, "stop": True}, None
        finally:
            record.last_seen = self.store.now()
            if worker in self.store.live:
                record.state = "computing"
        answered = reply_meta(reply.meta, self.protocol.name, op)  # (else a rule's bug: 500)
        answered[HELD] = round(now() - started, 6)
        out: dict[str, Any] = {"meta": answered, "stop": False}
        if reply.version is not None:
            out["version"] = reply.version
        return out, reply.vector

    def identify(self, op: str, header: dict[str, Any]) -> int | None:
        """The rank a request comes from, once its run, rank and session secret are checked
        (refusals raised). None for ``stop``, and for a rank no longer in a run that is
        stopping (answered ``stop``). Transports call it as soon as a header has arrived,
        so that only a session's holder makes the server receive a tensor."""
        run_id = require(header, "run_id", str)
        if run_id != self.run_id:
            raise Forbidden(f"wrong run {brief(run_id)}: this server runs {self.run_id!r}")
        if op == "stop":
            return None
        worker: int = require(header, "worker", int)
        if not 0 <= worker < len(self.workers):
            raise Forbidden(f"unknown worker {worker}: this run has ranks "
                            f"0..{len(self.workers) - 1}")
        if op != "join" and worker not in self.store.live:
            if self.store.stopping:
                return None
            raise NotInRun(f"worker {worker} is not in the run (not joined, left or dropped "
                           "after a timeout): join first")
        if op != "join":
            self.workers[worker].check_session(worker, header.get("session"))
        # (a replay is refused before its tensor is received)
        self.workers[worker].check_seq(worker, op, header.get("seq"))
        return worker

    async def _dispatch(self, op: str, worker: int, header: dict[str, Any],
                        meta: dict[str, Any], vector: torch.Tensor | None,
                        finite: bool | None) -> Reply:
        if op == "join":
            self._check_fit(header)
            return await self._join(worker, header.get("session"), header.get("away", False))
        if op == "leave":
            await self._leave(worker)
            return Reply()
        if "codec" in header and op != "push":
            raise BadRequest(f"only pushes may be compressed, not {op}")
        if op == "query":
            self.workers[worker].take(worker, op, header.get("seq"), header.get("session"))
            return Reply(meta=await self.rule.on_query(worker, meta))
        base_version = require_count(header, "base_version")
        if op == "pull":
            return await self.rule.on_pull(Pull(worker, base_version, meta))
        kind = require(header, "kind", str)
        if kind not in self.rule.push_kinds:
            accepted = ", ".join(sorted(self.rule.push_kinds))
            raise BadRequest(f"push kind {brief(kind)} not accepted by {self.protocol.name} "
                             f"(accepts: {accepted})")
        if vector is None:
            raise BadRequest("push carries no tensor")
        if "codec" in header:
            if kind not in COMPRESSED_KINDS:
                raise BadRequest(f"a {brief(kind)} push is never compressed (only "
                                 f"{', '.join(sorted(COMPRESSED_KINDS))} pushes may be)")
            vector = await self._decompress(header["codec"], vector, meta)
            finite = None
        push = Push(worker, base_version, kind, vector, require_count(header, "steps"),
                    require_count(header, "samples"), meta)
        if push.samples > push.steps * self.settings.max_batch:
            raise Unacceptable(f"{push.samples} samples in {push.steps} steps: more than "
                               f"max_batch = {self.settings.max_batch} per step")
        if base_version > self.store.version:  # e.g. the server resumed an older checkpoint
            raise OutOfStep(f"base version {base_version} is ahead of the server's "
                            f"{self.store.version}")
        self.workers[worker].check_base(worker, base_version)
        then_pull = header.get("then_pull", False)
        if not isinstance(then_pull, bool):
            raise BadRequest(f"field 'then_pull' must be a bool, got {brief(then_pull)}")
        if finite is None:
            finite = await self.store.compute(all_finite, vector)
        if not finite:
            count = self.workers[worker].count_nonfinite(worker)
            self.run.log(Kind.NONFINITE_PUSH, worker=worker, count=count)
            raise Unacceptable("non-finite values (NaN or Inf) in the pushed tensor")
        self.workers[worker].take(worker, op, header.get("seq"), header.get("session"))
        pushed = await self.rule.on_push(push)
        if not then_pull:
            return Reply(meta=pushed)
        del push, vector  # the rule keeps what it needs: not held while the pull waits
        pulled = await self.rule.on_pull(Pull(worker, base_version, meta))
        reply_meta(pulled.meta, self.protocol.name, "pull")["push"] = pushed
        return pulled

    async def _decompress(self, codec: object, payload: torch.Tensor,
                          meta: dict[str, Any]) -> torch.Tensor:
        """The float32 vector a compressed push carries (refused when malformed)."""
        numel = self.rule.tensor_numel("push", meta)
        if numel is None:
            raise BadRequest("this push may carry no tensor")
        return await self.store.compute(decode, codec, payload, numel)

    def _check_fit(self, header: dict[str, Any]) -> None:
        """Refuse a join whose worker says (optional fields ``protocol``, ``numel``) that it
        runs another protocol, or a model of another size, than this server."""
        protocol = header.get("protocol", self.protocol.name)
        if protocol != self.protocol.name:
            raise Forbidden(f"this server runs protocol {self.protocol.name!r}, the worker "
                            f"{brief(protocol)}: a worker runs its server's protocol")
        numel = header.get("numel", self.store.numel)
        if numel != self.store.numel or isinstance(numel, bool):
            raise Forbidden(f"the worker's model has {brief(numel)} values, the server's "
                            f"{self.store.numel}: a worker needs its server's model")

    async def _join(self, worker: int, secret: object, away: object) -> Reply:
        """First joins wait for everyone (the start barrier); later ones rejoin at once,
        taking over the rank's live session when they carry no secret. The reply carries
        the session's secret (see `membership`). A first join `away` (its worker offline
        at the start) counts for the barrier but leaves the worker out of the run."""
        record = self.workers[worker]
        away = record.check_away(worker, away, self.run.started)
        while record.takes_over(worker, secret, worker in self.store.live, self.run.started):
            await self._lose(worker, replaced=True)  # (again if another join took it meanwhile)
        session = record.open_session()
        rejoin = self.run.started
        if rejoin and worker in self.store.live:  # it restarted before being dropped
            await self._drop(worker)
        self._joined += not record.joined
        record.joined, record.left = True, False
        record.joined_at = self.store.version
        if away:
            record.left, record.state = True, "left"
        else:
            self.store.live.add(worker)
        if rejoin:
            await self.rule.on_join(worker)
            record.joined_at = self.store.version  # a round may have closed meanwhile
            self.store.notify()
        elif self._joined == len(self.workers):
            self._start()
        try:
            while not self._all_joined.is_set():
                if self.store.stopping:
                    raise RunStopped
                await record.wait_start(worker, session, self._all_joined)  # (403: taken over)
        except asyncio.CancelledError:
            self._withdraw_join(worker, session)
            raise
        self.run.log(Kind.REJOIN if rejoin else Kind.JOIN, worker=worker,
                     version=self.store.version)
        reply = self.store.current()
        reply.meta["workers"] = len(self.workers)
        reply.meta["session"] = session
        return reply

    def _withdraw_join(self, worker: int, session: str) -> None:
        """Undo a first join cancelled at the start barrier (the transport cancels it when
        its client's connection closes: a worker that died before the run started), so
        that a restarted copy takes the rank at once; not once the run has started, nor
        when a later join of the rank (one carrying the secret) holds its session now."""
        record = self.workers[worker]
        if self._all_joined.is_set() or record.session != session:
            return
        self.store.live.discard(worker)
        self._joined -= 1
        record.joined, record.session, record.state = False, "", "starting"
        LOG.info("worker %d left while waiting for the run to start: its join is withdrawn",
                 worker)

    async def _leave(self, worker: int) -> None:
        record = self.workers[worker]
        record.left = True
        record.state = "left"
        await self._drop(worker)

    def status(self) -> dict[str, Any]:
        """A read-only snapshot for dashboards."""
        latest = self.evals[-1] if self.evals else None
        return {
            "protocol": self.protocol.name, "run_id": self.run_id,
            "version": self.store.version, "elapsed_s": self.elapsed(),
            "time_s": self.settings.time_s, "started": self.run.started,
            "stopping": self.store.stopping, "finished": self.finished.is_set(),
            "checkpoint_failures": self.run.checkpoint_failures,
            "accuracy": latest.accuracy if latest else None,
            "best_accuracy": max((p.accuracy for p in self.evals), default=None),
            "workers": [record.summary(rank, rank in self.store.held)
                        for rank, record in enumerate(self.workers)],
        }


def check_op(op: str) -> None:
    """Refuse an operation this server does not have."""
    if op not in OPS:
        raise UnknownOperation(f"unknown operation {brief(op)}")


def build_core(model: nn.Module, protocol: str | Protocol, workers: int,
               settings: ServerSettings | None = None, *, protocol_params: Any = None,
               test_data: tuple[torch.Tensor, torch.Tensor] | None = None,
               events: JsonlLog | None = None, seam: ServerSeam | None = None) -> ServerCore:
    """A `ServerCore` whose initial global model is `model`'s current parameters."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got a {type(model).__name__}")
    if settings is not None and not isinstance(settings, ServerSettings):
        raise ValueError(f"settings must be a ServerSettings (ServerSettings(lr=...) makes "
                         f"one), got a {type(settings).__name__}")
    proto = protocol if isinstance(protocol, Protocol) else get_protocol(protocol)
    params = proto.make_params(protocol_params, workers)
    settings = settings or ServerSettings()
    flat = FlatModule(copy.deepcopy(model), torch.device("cpu"))
    if not flat.num_params:
        raise ValueError(f"the model has no parameters to train: {type(model).__name__}")
    evaluator = None if test_data is None else make_evaluator(
        model, *test_data, device=settings.eval_device, samples=settings.eval_samples,
        batch_size=settings.eval_batch)
    return ServerCore(flat.flat, proto, params, workers, settings,
                      num_params=flat.num_params, evaluator=evaluator, events=events,
                      seam=seam, fingerprint=model_fingerprint(model), frozen=flat.frozen)
