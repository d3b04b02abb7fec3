"""Local SGD: periodic model averaging after H local steps.

Worker: wait until the server has a round for it, adopt the round's model, run H local SGD
steps, push the delta ``w_i(end) - w_i(start)`` with its sample count. Server: when every
participant of the round has pushed, ``w <- w + sum_i p_i delta_i`` with equal weights
``p_i = 1/N``, version += 1, and the next round opens.

A round is identified by the version its participants start from. The hooks
`LocalSgdServer.participants` (who trains in a round) and `LocalSgdServer.weight` (a
delta's unnormalised weight) are what FedAvg overrides.

Reference: S. U. Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import Protocol, Pull, Push, Reply, ServerRule, WorkerLoop, register
from asyncsync.schema import check_fields, option
from asyncsync.wire import WireError

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


class LocalSgdServer(ServerRule):
    """One round per version: the last participant's delta closes it."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: LocalSgdParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.round = self.participants(0)
        self._sum: torch.Tensor | None = None
        self._total = 0.0
        self._pushed: list[tuple[int, int]] = []

    def participants(self, version: int) -> frozenset[int]:
        """The workers that train in the round starting from `version`: all of them."""
        return frozenset(range(self.store.workers))

    def weight(self, push: Push) -> float:
        """A delta's weight before normalisation over the round: equal for all."""
        return 1.0

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            version = self.store.version
            if push.base_version != version:
                raise WireError(409, f"delta from version {push.base_version}, but the "
                                     f"round in progress starts from version {version}")
            if push.worker not in self.round:
                raise WireError(409, f"worker {push.worker} does not take part in the round "
                                     f"of version {version}")
            if any(worker == push.worker for worker, _ in self._pushed):
                raise WireError(409, f"worker {push.worker} already pushed for version "
                                     f"{version}")
            weight = self.weight(push)
            total = self._sum

            def accumulate() -> torch.Tensor:
                if total is None:
                    return push.vector * weight
                return total.add_(push.vector, alpha=weight)

            self._sum = await self.store.compute(accumulate)
            self._total += weight
            self._pushed.append((push.worker, push.base_version))
            if len(self._pushed) == len(self.round):
                await self._close_round()
        return {}

    async def _close_round(self) -> None:
        """``w <- w + sum / total`` as the next version; open the next round."""
        w, total, scale = self.store.w, self._sum, 1.0 / self._total
        assert total is not None
        new = await self.store.compute(lambda: w.add(total, alpha=scale))
        pushed = self._pushed
        self._sum, self._total, self._pushed = None, 0.0, []
        self.round = self.participants(self.store.version + 1)
        self.store.commit(new, pushed)

    def _has_work(self, worker: int) -> bool:
        return worker in self.round and all(w != worker for w, _ in self._pushed)

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer once the current round counts on `worker` and it has not pushed yet."""
        await self.store.wait_for(lambda: self._has_work(pull.worker), pull.worker)
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
