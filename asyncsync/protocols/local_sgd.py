"""Local SGD: periodic model averaging after H local steps.

Worker: wait until the server has a round for it, adopt the round's model, run H local SGD
steps, push the delta ``w_i(end) - w_i(start)`` with its sample count. Server: when every
live participant of the round has pushed, ``w <- w + sum_i p_i delta_i`` over the round's
deltas with equal weights ``p_i = 1/n`` (n: the deltas of the round), version += 1, and the
next round opens.

A round is identified by the version its participants start from. The hooks
`LocalSgdServer.participants` (who trains in a round) and `LocalSgdServer.weight` (a
delta's unnormalised weight) are what FedAvg overrides.

Reference: S. U. Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Collection, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncsync.protocols.base import Protocol, Pull, Push, Reply, WorkerLoop, register
from asyncsync.protocols.bsp import BarrierServer, average, contributions
from asyncsync.schema import check_fields, option

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.worker import WorkerContext


@dataclass(frozen=True)
class LocalSgdParams:
    """Parameters of local SGD."""

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "H: local SGD steps per round")

    def __post_init__(self) -> None:
        check_fields(self)


class LocalSgdServer(BarrierServer):
    """One round per version: the last live participant's delta closes it.

    Each round's participants are drawn when it opens from the live workers (before the
    run starts: from all of them); the round waits for those still live. A lost
    participant's delta is withdrawn and the round closes with the others'; if no
    participant is left, the round is drawn again from the live workers. When a worker
    rejoins, the open round is drawn again from the live workers if that keeps every
    participant still live (always so when every live worker trains in every round, as in
    local SGD: the rejoined worker then joins the open round); otherwise the rejoined
    worker waits for a round that draws it.

    Attributes:
        round: the participants drawn for the open round.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: LocalSgdParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.round = self.participants(0, range(store.workers))

    def participants(self, version: int, candidates: Collection[int]) -> frozenset[int]:
        """The workers, among `candidates`, that train in the round starting from `version`:
        all of them."""
        return frozenset(candidates)

    def weight(self, push: Push) -> float:
        """A delta's weight before normalisation over the round: equal for all."""
        return 1.0

    def members(self) -> Set[int]:
        return self.round & self.store.live

    def take(self, push: Push) -> None:
        self.weight(push)  # refuse a delta that cannot be weighted

    def left(self, worker: int) -> None:
        if not self.members():
            self.round = self.participants(self.store.version, self.store.live)

    def joined(self, worker: int) -> None:
        drawn = self.participants(self.store.version, self.store.live)
        if worker not in self.round and self.members() <= drawn:
            self.round = drawn

    async def close_round(self, pushes: dict[int, Push]) -> None:
        """``w <- w + weighted mean delta`` as the next version; open the next round."""
        w = self.store.w
        deltas = [push.vector for push in pushes.values()]
        weights = [self.weight(push) for push in pushes.values()]
        new = await self.store.compute(lambda: w + average(deltas, weights))
        self.store.commit(new, contributions(pushes))
        self.round = self.participants(self.store.version, self.store.live)

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer once the open round counts on the worker and it has not pushed yet."""
        def has_work() -> bool:
            return pull.worker in self.members() and pull.worker not in self.pushes

        await self.store.wait_for(has_work, pull.worker)
        return self.store.current()


class LocalSgdWorker(WorkerLoop):
    """Pull a round's model, run H local steps, push the delta."""

    async def run(self, ctx: WorkerContext) -> None:
        steps = self.params.local_steps
        while True:
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)
            result = await ctx.steps(steps)
            delta = await ctx.in_thread(lambda base: ctx.trainer.vector_copy() - base, anchor)
            await ctx.push("delta", delta, steps=steps, samples=result.samples)


LOCAL_SGD = register(Protocol("local_sgd", "local SGD: H local steps, then average the deltas",
                              LocalSgdParams, LocalSgdServer, LocalSgdWorker))
