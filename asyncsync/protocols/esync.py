"""ESync: a state oracle balances local steps so that every worker reaches the barrier together.

Before each local step a worker asks the server's state oracle whether to keep computing or
to synchronize, reporting ``k`` (local steps since its last synchronization) and ``c`` (how
long its last step took). The oracle's rule:

- a worker is never ready before it has made one local step of the round;
- the slowest worker (largest ``c``) is ready as soon as its step ends;
- any other worker ``i`` is ready when ``c_i + eps * c_i`` exceeds the time left until the
  slowest worker finishes its current step (zero once the slowest is at the barrier).

Synchronization is a synchronous average of deltas with global learning rate 1: each worker
pushes ``w_i - w`` (its local progress since it adopted ``w``), and once the deltas of every
live worker are in, ``w <- w + mean_i delta_i``, version += 1, and everyone adopts ``w``. Fast
workers thus do more local steps per round and nobody waits long at the barrier.

Choices: eps is relative to the querying worker's own step time (``eps = 0.5`` means half a
step of slack). A worker therefore stops after the first k steps with ``(1 + eps) c_i >
c_s - k c_i`` and waits less than ``(1 + eps) c_i`` at the barrier; when the slowest's step
is a whole multiple m of its own and 0 < eps < 1, it makes m - 1 steps and waits one of its
own steps (the m-th would end exactly with the slowest's, without the slack). The oracle
keeps time on the server's clock: a step ends when the worker's query arrives, so worker
clocks need not agree. Until every live worker has reported a step time the slowest is
unknown, and nobody is ready; after a round closes, nobody is ready until the slowest has
started its next step (its query of ``k = 0`` arrived: its new model may come late, over
a slow link), as in the authors' state server.

The oracle counts computation only, as the paper's does: once the slowest's step has
ended, the time left is zero and the others are ready, so the time its delta takes to
upload (and the round's model to come back) is spent waiting at the barrier by everyone.
Over an even, fast intra-data-center network, the paper's setting, that is short; with a
slow link to the slowest worker it is not hidden (keeping the others stepping until the
slowest's delta has arrived would be a rule of our own, with no estimate of the upload in
the paper to bound it). NBSync is the protocol here for slow links: its synchronization
runs beside the local steps.

Reference: Z. Li, H. Zhou, T. Zhou, H. Yu, Z. Xu, G. Sun, "ESync: Accelerating Intra-Domain
Federated Learning in Heterogeneous Data Centers", IEEE Transactions on Services Computing,
2020 (doi:10.1109/TSC.2020.3044043).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncsync.protocols.base import (
    BadRequest,
    Protocol,
    Push,
    WorkerLoop,
    check_fields,
    no_round_policies,
    option,
    register,
    require_count,
    wide_history,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import RoundServer

NOT_STARTED = math.inf
"""The start of a step not begun yet: the time left until it ends is unbounded."""


@dataclass(frozen=True)
class EsyncParams:
    """ESync's parameters."""

    NOT_OFFERED = no_round_policies(
        "esync", "its rounds wait for every worker: its state oracle sizes local steps so that all "
                "arrive together")

    eps: float = option(0.5, lambda v: math.isfinite(v) and v >= 0, "must be finite and >= 0",
                        "readiness slack, relative to the worker's own step time")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class EsyncRound:
    """One finished round: local steps per worker, and how long each was held at the barrier."""

    version: int
    steps: dict[int, int] = field(default_factory=dict)
    held_s: dict[int, float] = field(default_factory=dict)


class EsyncServer(RoundServer[EsyncParams]):
    """The state oracle and the synchronous barrier of deltas, over the live workers.

    A lost worker's step time and step clock are forgotten, so the oracle picks the
    slowest among the others; its delta of the open round counts if it arrived, else the
    round closes with the others' deltas. A rejoined worker has no step time until it reports
    one, so nobody is ready before its first local step; the round waits for its delta.

    Attributes:
        history: the most recent finished rounds (at most `wide_history(workers)`), in
            order.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: EsyncParams, store: Store) -> None:
        super().__init__(params, store)
        self.eps = params.eps
        self.history: deque[EsyncRound] = deque(maxlen=wide_history(store.workers))
        workers = store.workers
        self._step_s: list[float | None] = [None] * workers
        # when each worker's current step began; None: at the barrier; NOT_STARTED: it
        # has not started its first step since the last round closed
        self._step_began: list[float | None] = [None] * workers
        self._arrived: dict[int, float] = {}

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        k = require_count(meta, "k")
        step_s = meta.get("c")
        if step_s is not None and (isinstance(step_s, bool) or not isinstance(step_s, int | float)
                                   or not math.isfinite(step_s) or step_s < 0):
            raise BadRequest("field 'c' must be a finite number >= 0")
        if k > 0 and step_s is None:
            raise BadRequest("a query after a local step must report 'c', its duration")
        now = self.store.now()
        if step_s is not None:
            self._step_s[worker] = float(step_s)
        ready = k > 0 and step_s is not None and self._ready(worker, float(step_s), now)
        self._step_began[worker] = None if ready else now
        return {"sync": ready}

    def _ready(self, worker: int, mine: float, now: float) -> bool:
        """The oracle's rule for a worker that has made at least one step this round and
        whose last step took `mine` seconds."""
        times = {worker: mine}
        for rank in self.store.live:
            step_s = self._step_s[rank]
            if step_s is None:
                return False  # someone has not finished a step yet: the slowest is unknown
            times[rank] = step_s
        slowest = max(times, key=times.__getitem__)
        if mine >= times[slowest]:
            return True
        began = self._step_began[slowest]
        left = 0.0 if began is None else max(0.0, began + times[slowest] - now)
        return mine * (1 + self.eps) > left

    def take(self, push: Push) -> None:
        self._arrived[push.worker] = self.store.now()

    def left(self, worker: int) -> None:
        self._arrived.pop(worker, None)
        self._step_s[worker] = self._step_began[worker] = None

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``w + mean delta``."""
        return current + mean

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        """Commit the round, record it; no worker has started a step of the next round."""
        await super().close_round(fragment, pushes)
        now = self.store.now()
        self.history.append(EsyncRound(
            self.store.version, {worker: push.steps for worker, push in pushes.items()},
            {worker: now - self._arrived[worker] for worker in pushes}))
        self._arrived = {}
        self._step_began = [NOT_STARTED] * self.store.workers


class EsyncWorker(WorkerLoop[EsyncParams]):
    """Ask the oracle before each step; step, or push the round's delta and adopt the average."""

    async def run(self, ctx: Context) -> None:
        anchor = await ctx.snapshot()
        steps = samples = 0
        step_s: float | None = None
        while True:
            report: dict[str, Any] = {"k": steps}
            if step_s is not None:
                report["c"] = step_s
            if (await ctx.query(report)).get("sync"):
                delta = await ctx.delta_since(anchor)
                anchor, version, _ = await ctx.push_and_pull("delta", delta, steps=steps,
                                                        samples=samples)
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
