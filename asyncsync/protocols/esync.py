"""ESync: a state oracle balances local steps so that every worker reaches the barrier together.

Before each local step a worker asks the server's state oracle whether to keep computing or
to synchronize, reporting ``k`` (local steps since its last synchronization) and ``c`` (how
long its last step took). The oracle's rule:

- a worker is never ready before it has made one local step of the round;
- the slowest worker (largest ``c``) is ready as soon as its step ends;
- any other worker ``i`` is ready when ``c_i + eps * c_i`` exceeds the time left until the
  slowest worker finishes its current step (zero once the slowest is at the barrier).

Synchronization is a synchronous average of deltas with global learning rate 1: each worker
pushes ``w_i - w`` (its local progress since it adopted ``w``), and once all N deltas of the
round are in, ``w <- w + (1/N) sum_i delta_i``, version += 1, and everyone adopts ``w``. Fast
workers thus do more local steps per round and nobody waits long at the barrier.

Choices: eps is relative to the querying worker's own step time (``eps = 0.5`` means half a
step of slack). The oracle keeps time on the server's clock: a step ends when the worker's
query arrives, so worker clocks need not agree. Until every worker has reported a step
time the slowest is unknown, and nobody is ready.

Reference: Z. Li, H. Zhou, T. Zhou, H. Yu, Z. Xu, G. Sun, "ESync: Accelerating Intra-Domain
Federated Learning in Heterogeneous Data Centers", IEEE Transactions on Services Computing,
2020 (doi:10.1109/TSC.2020.3044043).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
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
from asyncsync.wire import WireError, require_count

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.trainer import Trainer
    from asyncsync.worker import WorkerContext


@dataclass(frozen=True)
class EsyncParams:
    """ESync's parameters."""

    eps: float = option(0.5, lambda v: math.isfinite(v) and v >= 0, "must be finite and >= 0",
                        "readiness slack, relative to the worker's own step time")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class EsyncRound:
    """One finished round: local steps per worker, and how long each waited at the barrier."""

    version: int
    steps: dict[int, int] = field(default_factory=dict)
    wait_s: dict[int, float] = field(default_factory=dict)


class EsyncServer(ServerRule):
    """The state oracle and the synchronous barrier of deltas.

    Attributes:
        rounds: every finished round, in order (what the tests and reports inspect).
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: EsyncParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.eps = params.eps
        self.rounds: list[EsyncRound] = []
        workers = store.workers
        self._step_s: list[float | None] = [None] * workers
        self._step_began: list[float | None] = [None] * workers  # None: at the barrier
        self._sum: torch.Tensor | None = None
        self._contributions: list[tuple[int, int]] = []
        self._arrived: dict[int, float] = {}
        self._steps: dict[int, int] = {}

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        k = require_count(meta, "k")
        step_s = meta.get("c")
        if step_s is not None and (isinstance(step_s, bool) or not isinstance(step_s, int | float)
                                   or not math.isfinite(step_s) or step_s < 0):
            raise WireError(400, "field 'c' must be a finite number >= 0")
        if k > 0 and step_s is None:
            raise WireError(400, "a query after a local step must report 'c', its duration")
        now = time.monotonic()
        if step_s is not None:
            self._step_s[worker] = float(step_s)
        ready = k > 0 and self._ready(worker, now)
        self._step_began[worker] = None if ready else now
        return {"sync": ready}

    def _ready(self, worker: int, now: float) -> bool:
        """The oracle's rule for a worker that has made at least one step this round."""
        times = [c for c in self._step_s if c is not None]
        if len(times) < len(self._step_s):
            return False  # someone has not finished a step yet: the slowest is unknown
        mine = times[worker]
        slowest = max(range(len(times)), key=times.__getitem__)
        if mine >= times[slowest]:
            return True
        began = self._step_began[slowest]
        left = 0.0 if began is None else max(0.0, began + times[slowest] - now)
        return mine * (1 + self.eps) > left

    async def on_push(self, push: Push) -> dict[str, Any]:
        arrived = time.monotonic()
        n = self.store.workers
        async with self.store.lock:
            version = self.store.version
            if push.base_version != version:
                raise WireError(409, f"delta of version {push.base_version}, "
                                     f"but the round is at version {version}")
            if push.worker in self._arrived:
                raise WireError(409, f"worker {push.worker} already pushed in this round")
            total = push.vector if self._sum is None else await self.store.compute(
                torch.add, self._sum, push.vector)
            new = (await self.store.compute(lambda: self.store.w + total / n)
                   if len(self._arrived) + 1 == n else None)
            # nothing awaits from here on: a request cancelled above changed nothing
            self._sum = total
            self._contributions.append((push.worker, push.base_version))
            self._arrived[push.worker] = arrived
            self._steps[push.worker] = push.steps
            if new is not None:
                self._finish_round(new)
        return {}

    def _finish_round(self, new: torch.Tensor) -> None:
        """Commit ``w + mean delta``, record the round, restart every worker's step clock."""
        now = time.monotonic()
        self.store.commit(new, self._contributions)
        self.rounds.append(EsyncRound(
            self.store.version, dict(self._steps),
            {worker: now - t for worker, t in self._arrived.items()}))
        self._sum, self._contributions, self._arrived, self._steps = None, [], {}, {}
        self._step_began = [now] * self.store.workers

    async def on_pull(self, pull: Pull) -> Reply:
        await self.store.wait_for(lambda: self.store.version > pull.base_version, pull.worker)
        return self.store.current()


def _progress(trainer: Trainer, anchor: torch.Tensor) -> torch.Tensor:
    """The local progress ``w_i - anchor`` as a CPU vector."""
    return trainer.vector_copy() - anchor


class EsyncWorker(WorkerLoop):
    """Ask the oracle before each step; step, or push the round's delta and adopt the average."""

    async def run(self, ctx: WorkerContext) -> None:
        anchor = await ctx.in_thread(ctx.trainer.vector_copy)
        steps = samples = 0
        step_s: float | None = None
        while True:
            report: dict[str, Any] = {"k": steps}
            if step_s is not None:
                report["c"] = step_s
            if (await ctx.query(report)).get("sync"):
                delta = await ctx.in_thread(_progress, ctx.trainer, anchor)
                await ctx.push("delta", delta, steps=steps, samples=samples)
                anchor, version, _ = await ctx.pull()
                await ctx.adopt(anchor, version)
                steps = samples = 0
            else:
                result = await ctx.steps(1)
                step_s = result.compute_s
                steps += 1
                samples += result.samples


ESYNC = register(Protocol("esync", "state oracle: fast workers do more local steps, "
                                   "all reach the delta-averaging barrier together",
                          EsyncParams, EsyncServer, EsyncWorker))
