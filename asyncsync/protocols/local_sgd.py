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

import torch

from asyncsync.protocols.base import (
    Protocol,
    Pull,
    Push,
    Reply,
    WorkerLoop,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import RoundServer


@dataclass(frozen=True)
class LocalSgdParams:
    """Parameters of local SGD."""

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "H: local SGD steps per round")

    def __post_init__(self) -> None:
        check_fields(self)


class LocalSgdServer(RoundServer):
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

    def __init__(self, params: LocalSgdParams, store: Store) -> None:
        super().__init__(params, store)
        self.round = self.participants(0, range(store.workers))

    def participants(self, version: int, candidates: Collection[int]) -> frozenset[int]:
        """The workers, among `candidates`, that train in the round starting from `version`:
        all of them."""
        return frozenset(candidates)

    def members(self, fragment: int = 0) -> Set[int]:
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

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``w + weighted mean delta``."""
        return current + mean

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        """Commit the round, then draw the next one's participants."""
        await super().close_round(fragment, pushes)
        self.round = self.participants(self.store.version, self.store.live)

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer once the open round counts on the worker and it has not pushed yet."""
        def has_work() -> bool:
            return pull.worker in self.members() and pull.worker not in self.pending[0]

        await self.store.wait_for(has_work, pull.worker)
        return self.store.current()


class LocalSgdWorker(WorkerLoop):
    """Pull a round's model, run H local steps, push the delta."""

    async def run(self, ctx: Context) -> None:
        steps = self.params.local_steps
        while True:
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)
            result = await ctx.steps(steps)
            delta = await ctx.delta_since(anchor)
            await ctx.push("delta", delta, steps=steps, samples=result.samples)


LOCAL_SGD = register(Protocol("local_sgd", "local SGD: H local steps, then average the deltas",
                              LocalSgdParams, LocalSgdServer, LocalSgdWorker))
