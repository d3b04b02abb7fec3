"""WBSP: worker-busy synchronous parallel; fast workers keep training instead of waiting.

Worker: after every local SGD step, push the delta since its last push. The push reply says
whether a new global model may be pulled; if so, pull it and continue from it, otherwise
keep training from the local model.

Server: add each delta on arrival to a working model, ``w <- w + delta / N`` (N: the live
workers). The working model becomes a new pullable version (version += 1) only when the
slowest worker pushes a new step, so every worker pulls the same consistent global models
while the fast ones contribute several steps per version. A push is answered
``pull = true`` when a version newer than the pusher's base version exists.

Choices: the slowest worker is detected dynamically as the one with the lowest recent step
rate: the server keeps, per worker, an exponentially weighted moving average (weight
``rate_smoothing`` on the newest value) of the seconds per step between its consecutive
pushes; a worker without an estimate yet (fewer than two pushes) counts as slowest (its
pushes publish), and only live workers count. Among measured workers the slowest is one,
and it keeps its place until another's estimate exceeds its own by `SWITCH_MARGIN` (10 %;
a tie at a pick goes to the lowest rank): with equally slow workers (e.g. the paper's odd
ranks, which all sleep alike) the version then advances once per slow step, not once per
push of whichever estimate is highest at the moment (in a virtual run of
`paper_wbsp_h2`, 98 versions in 15 s for 71 slow steps, each extra version holding one
slow worker's step alone; 73 with this rule). ``slow_worker`` fixes the slowest by rank
instead, as the official code does; while that worker is out of the run, the slowest is
detected.

Reference: D. Yang, B. Hu, A. Liu, A.-L. Jin, K. L. Yeung, Y. You, "WBSP: Addressing
stragglers in distributed machine learning with worker-busy synchronous parallel",
Parallel Computing 121, 103092, 2024.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import (
    HISTORY,
    BadRequest,
    Protocol,
    Push,
    ServerRule,
    Unacceptable,
    WorkerLoop,
    all_finite,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store

SWITCH_MARGIN = 0.1
"""How much longer (relative) another worker's step must be than the detected slowest's
for it to become the slowest: equally slow workers, whose estimates cross back and forth
with the noise of their steps, do not each publish versions."""


@dataclass(frozen=True)
class WbspParams:
    """WBSP's parameters (shared by wbsp_opt)."""

    NOT_OFFERED = no_round_policies(
        "wbsp and wbsp_opt", "they have no rounds: deltas are added on arrival and the slowest "
                            "worker's pushes publish versions")

    slow_worker: int | None = option(None, lambda v: v is None or v >= 0, "must be >= 0",
                                     "rank of the slowest worker (default: detected from "
                                     "step rates)")
    rate_smoothing: float = option(0.5, lambda v: 0 < v <= 1, "must be in (0, 1]",
                                   "weight of the newest step time in the slowest-worker "
                                   "estimate")

    def __post_init__(self) -> None:
        check_fields(self)

    def check_workers(self, workers: int) -> None:
        """Refuse a `slow_worker` that is not a rank of a run of `workers` workers."""
        if self.slow_worker is not None and self.slow_worker >= workers:
            raise ValueError(f"slow_worker: must be a rank below {workers}, "
                             f"got {self.slow_worker}")


@dataclass(frozen=True)
class PushRecord:
    """One push as the server saw it: who, how many steps, and whether it made a version."""

    worker: int
    steps: int
    published: bool


class WbspServer(ServerRule[WbspParams]):
    """Deltas accumulate on arrival; the slowest live worker's pushes publish versions.

    A lost worker no longer counts as the slowest, so the next push of the slowest of the
    others publishes (its deltas already in the working model stay there). A rejoined
    worker's step rate is measured afresh: until it is known the rejoined worker counts as
    the slowest, so its first push publishes. The working model (deltas not yet
    published) is part of the checkpoint; a resumed server continues from it.

    Attributes:
        pushes: the most recent accepted pushes (at most `HISTORY`), in arrival order.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: WbspParams, store: Store) -> None:
        params.check_workers(store.workers)
        super().__init__(params, store)
        self.slow_worker = params.slow_worker
        self.smoothing = params.rate_smoothing
        self.pushes: deque[PushRecord] = deque(maxlen=HISTORY)
        self._working = store.w
        self._pending: list[tuple[int, int]] = []
        self._last_push: list[float | None] = [None] * store.workers
        self._step_s: list[float] = [math.inf] * store.workers
        self._slowest: int | None = None  # the detected slowest (see SWITCH_MARGIN)

    async def on_push(self, push: Push) -> dict[str, Any]:
        if push.steps < 1:
            raise BadRequest("a delta must carry at least one step")
        arrived = self.store.now()
        async with self.store.lock:
            working, n = self._working, max(1, len(self.store.live))
            candidate = await self.store.compute(lambda: working + push.vector / n)
            if not await self.store.compute(all_finite, candidate):
                raise Unacceptable("the delta would make the working model non-finite")
            self._working = candidate
            self._pending.append((push.worker, push.base_version))
            self._measure(push.worker, push.steps, arrived)
            publish = self._is_slowest(push.worker)
            if publish:
                pending, self._pending = self._pending, []
                self.store.commit(self._working, pending)
            self.pushes.append(PushRecord(push.worker, push.steps, publish))
            return {"pull": self.store.version > push.base_version}

    def _measure(self, worker: int, steps: int, now: float) -> None:
        """Update the worker's moving average of seconds per step."""
        last = self._last_push[worker]
        self._last_push[worker] = now
        if last is None:
            return
        step_s = (now - last) / steps
        old = self._step_s[worker]
        self._step_s[worker] = step_s if math.isinf(old) else (
            (1 - self.smoothing) * old + self.smoothing * step_s)

    def _is_slowest(self, worker: int) -> bool:
        if self.slow_worker in self.store.live:
            return worker == self.slow_worker
        if math.isinf(self._step_s[worker]):
            return True  # not measured yet: counts as slowest
        slowest = max(self.store.live, key=lambda rank: (self._step_s[rank], -rank),
                      default=worker)
        held = self._slowest
        if (held is None or held not in self.store.live
                or self._step_s[slowest] > (1 + SWITCH_MARGIN) * self._step_s[held]):
            self._slowest = held = slowest
        return worker == held

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            self._last_push[worker] = None
            self._step_s[worker] = math.inf

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The working model: deltas accepted since the last published version."""
        return {"working": self._working}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from the checkpoint's working model (the resumed global model if none)."""
        working = state.get("working", self.store.w)
        if working.shape != self.store.w.shape:
            raise ValueError(f"working model has shape {tuple(working.shape)}, the model "
                             f"{tuple(self.store.w.shape)}")
        self._working, self._pending = working, []


class WbspWorker(WorkerLoop[WbspParams]):
    """One local step, push its delta, pull when the server says a new version is ready."""

    async def run(self, ctx: Context) -> None:
        last = await ctx.snapshot()
        while True:
            result = await ctx.steps(1)
            delta, last = await ctx.delta_and_snapshot(last)
            reply = await ctx.push("delta", delta, steps=1, samples=result.samples)
            if reply.get("pull"):
                last, version, _ = await ctx.pull()
                await ctx.adopt(last, version)


WBSP = register(Protocol("wbsp", "worker-busy sync: fast workers push every step and keep "
                                 "training; the slowest worker's pushes make versions",
                         WbspParams, WbspServer, WbspWorker))
