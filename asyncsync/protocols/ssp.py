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

Reference: Q. Ho, J. Cipar, H. Cui, J. K. Kim, S. Lee, P. B. Gibbons, G. A. Gibson,
G. R. Ganger, E. P. Xing, "More Effective Distributed ML via a Stale Synchronous Parallel
Parameter Server", NIPS 2013.
"""

from __future__ import annotations

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
    option,
    register,
)
from asyncsync.protocols.ports import Store


@dataclass(frozen=True)
class SspParams:
    """Parameters of SSP."""

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

    def gap(self, worker: int) -> int:
        """How many clocks `worker` is ahead of the slowest live worker."""
        slowest = min((self.clocks[j] for j in self.store.live), default=self.clocks[worker])
        return self.clocks[worker] - slowest

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            gap = self.gap(push.worker)
            if gap > self.bound:
                raise OutOfStep(f"worker {push.worker} is {gap} clocks ahead of the slowest "
                                f"(bound {self.bound}); pull before computing")
            await self.store.apply_gradient(push.vector, [(push.worker, push.base_version)])
            self.clocks[push.worker] += 1
            self.store.notify()
        return {"clock": self.clocks[push.worker]}

    async def on_pull(self, pull: Pull) -> Reply:
        await self.store.wait_for(lambda: self.gap(pull.worker) <= self.bound, pull.worker)
        return self.store.current()

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            others = (self.clocks[j] for j in self.store.live if j != worker)
            self.clocks[worker] = min(others, default=self.clocks[worker])


SSP = register(Protocol("ssp", "stale synchronous parallel: async SGD, clock gap at most s",
                        SspParams, SspServer, AspWorker))
