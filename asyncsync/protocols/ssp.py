"""SSP: stale synchronous parallel (bounded staleness).

Each worker i has a clock c_i, the number of iterations it has completed (gradients the
server has applied for it). Worker: pull the current model, compute a gradient, push it,
repeat. Server: apply each gradient on arrival, ``w <- opt_step(w, g)``, version += 1, and
advance the pusher's clock; a pull, which starts the worker's next iteration, is held while
``c_i - min_j c_j > s``. With s = 0 no worker starts iteration k + 1 before every worker
finished iteration k (BSP's pattern); with a large s nobody ever waits (ASP).

Only live workers count in ``min_j c_j``: a lost worker no longer holds the others back.
A worker that rejoins restarts at the smallest clock of the live workers (so it is held
by nobody and holds nobody back). A push from a worker whose clock is beyond the bound (it
did not pass the pull gate) is refused as out of step.

``min_j c_j`` is kept as a count of live workers per clock value, updated in O(1) per push
and rebuilt (O(n)) only when the live set changes (``store.membership``): a push and
each held pull's check do not grow with the number of workers.

Reference: Q. Ho, J. Cipar, H. Cui, J. K. Kim, S. Lee, P. B. Gibbons, G. A. Gibson,
G. R. Ganger, E. P. Xing, "More Effective Distributed ML via a Stale Synchronous Parallel
Parameter Server", NIPS 2013.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from asyncsync.protocols.asp import AspWorker
from asyncsync.protocols.base import (
    OutOfStep,
    Protocol,
    Pull,
    Push,
    Reply,
    ServerRule,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Store


@dataclass(frozen=True)
class SspParams:
    """Parameters of SSP."""

    NOT_OFFERED = no_round_policies(
        "ssp", "it has no rounds: each gradient is applied on arrival, within a bound on the "
              "workers' clock gap")

    staleness: int = option(3, lambda v: v >= 0, "must be >= 0",
                            "s: the largest clock gap to the slowest worker")

    def __post_init__(self) -> None:
        check_fields(self)


class SspServer(ServerRule[SspParams]):
    """Apply gradients on arrival; hold a pull while its worker is more than s clocks ahead
    of the slowest live worker (a lost worker stops counting; a rejoined one restarts at
    the slowest live clock)."""

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: SspParams, store: Store) -> None:
        super().__init__(params, store)
        self.bound = params.staleness
        self.clocks = [0] * store.workers
        self._per_clock: Counter[int] = Counter()  # live workers at each clock value
        self._slowest: int | None = None
        self._counted_at = -1  # the store's membership the counts were made for

    def slowest(self) -> int | None:
        """The smallest clock of the live workers (None while none is live)."""
        if self._counted_at != self.store.membership:
            self._per_clock = Counter(self.clocks[j] for j in self.store.live)
            self._slowest = min(self._per_clock, default=None)
            self._counted_at = self.store.membership
        return self._slowest

    def gap(self, worker: int) -> int:
        """How many clocks `worker` is ahead of the slowest live worker."""
        slowest = self.slowest()
        return 0 if slowest is None else self.clocks[worker] - slowest

    def _tick(self, worker: int) -> None:
        """Advance `worker`'s clock, and the counts while they are current."""
        clock = self.clocks[worker]
        self.clocks[worker] = clock + 1
        if self._counted_at != self.store.membership or worker not in self.store.live:
            return  # not counted: the next `slowest` counts afresh, or it is not live
        self._per_clock[clock] -= 1
        self._per_clock[clock + 1] += 1
        if clock == self._slowest and not self._per_clock[clock]:
            del self._per_clock[clock]
            self._slowest = clock + 1  # nobody live was below `clock`; `worker` is above

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            gap = self.gap(push.worker)
            if gap > self.bound:
                raise OutOfStep(f"worker {push.worker} is {gap} clocks ahead of the slowest "
                                f"(bound {self.bound}); pull before computing")
            await self.store.apply_gradient(push.vector, [(push.worker, push.base_version)])
            self._tick(push.worker)
            self.store.notify()
        return {"clock": self.clocks[push.worker]}

    async def on_pull(self, pull: Pull) -> Reply:
        await self.store.wait_for(lambda: self.gap(pull.worker) <= self.bound, pull.worker)
        return self.store.current()

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            others = (self.clocks[j] for j in self.store.live if j != worker)
            self.clocks[worker] = min(others, default=self.clocks[worker])
            self._counted_at = -1  # its clock moved: count afresh


SSP = register(Protocol("ssp", "stale synchronous parallel: async SGD, clock gap at most s",
                        SspParams, SspServer, AspWorker))
