"""DiLoCo: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient.

Worker: starting from the global model ``w``, run H local (inner) SGD steps, push the
pseudo-gradient ``g_i = w - w_i``, pull the next global model and adopt it. Server: when
all N pseudo-gradients of a round are in, ``w <- w - outer.update(w, mean_i g_i)`` where
``outer`` is SGD with Nesterov momentum (lr 0.7, momentum 0.9), version += 1, and the pulls
are released. Outer momentum 0 gives plain outer SGD (lr 1 is then local SGD's averaging).
The inner optimizer is the worker's local SGD (the paper uses AdamW).

The round barrier is `RoundServer`: one vector per worker per round of each *fragment* of
the model (DiLoCo has one fragment, the whole vector); Overlap Local SGD and Streaming
DiLoCo reuse it with their own `RoundServer.combine`.

Reference: A. Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv:2311.08105, 2023.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.optim import FlatSGD
from asyncsync.protocols.base import Protocol, Pull, Push, Reply, ServerRule, WorkerLoop, register
from asyncsync.schema import check_fields, option
from asyncsync.wire import WireError

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.trainer import Trainer
    from asyncsync.worker import WorkerContext


@dataclass(frozen=True)
class DilocoParams:
    """Parameters of DiLoCo."""

    inner_steps: int = option(50, lambda v: v >= 1, "must be >= 1",
                              "H: local (inner) steps between outer steps")
    outer_lr: float = option(0.7, lambda v: v > 0, "must be > 0", "outer learning rate")
    outer_momentum: float = option(0.9, lambda v: 0 <= v < 1, "must be in [0, 1)",
                                   "outer Nesterov momentum (0: plain outer SGD)")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RoundRecord:
    """One completed round: which fragment, its round number, the version it made."""

    fragment: int
    round: int
    version: int


class RoundServer(ServerRule):
    """A barrier per fragment: each round takes one vector per worker, then `combine`s.

    Fragments are contiguous slices of the flat vector (`fragments`); a request names its
    fragment in ``meta["fragment"]`` (default 0). A pull waits for the round of the
    worker's last push of that fragment and answers with that fragment of ``w``.

    Attributes:
        rounds: every completed round, in commit order.
    """

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: Any, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.bounds = self.fragments()
        self.rounds: list[RoundRecord] = []
        self._pending: list[dict[int, Push]] = [{} for _ in self.bounds]
        self._open = [0] * len(self.bounds)
        self._done = [0] * len(self.bounds)
        self._pushed_round: dict[tuple[int, int], int] = {}

    def fragments(self) -> list[tuple[int, int]]:
        """The ``(start, stop)`` slices of the flat vector; one, the whole, by default."""
        return [(0, self.store.w.numel())]

    @abstractmethod
    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The fragment's new value from its current value and the round's mean (in a thread)."""

    def fragment_of(self, meta: dict[str, Any]) -> int:
        """The fragment a request names; a 400 for anything but a known index."""
        fragment = meta.get("fragment", 0)
        if (not isinstance(fragment, int) or isinstance(fragment, bool)
                or not 0 <= fragment < len(self.bounds)):
            raise WireError(400, f"unknown fragment {fragment!r}: this run has fragments "
                                 f"0..{len(self.bounds) - 1}")
        return fragment

    def tensor_numel(self, op: str, meta: dict[str, Any]) -> int | None:
        if op != "push":
            return None
        start, stop = self.bounds[self.fragment_of(meta)]
        return stop - start

    async def on_push(self, push: Push) -> dict[str, Any]:
        fragment = self.fragment_of(push.meta)
        pending = self._pending[fragment]
        number = self._open[fragment]
        if push.worker in pending:
            raise WireError(409, f"worker {push.worker} already pushed fragment {fragment} "
                                 f"for round {number}")
        pending[push.worker] = push
        self._pushed_round[fragment, push.worker] = number
        if len(pending) == self.store.workers:
            self._pending[fragment] = {}
            self._open[fragment] += 1
            await self._close_round(fragment, number, pending)
        return {"fragment": fragment, "round": number}

    async def _close_round(self, fragment: int, number: int, pushes: dict[int, Push]) -> None:
        start, stop = self.bounds[fragment]
        vectors = [pushes[worker].vector for worker in sorted(pushes)]

        def merged(w: torch.Tensor) -> torch.Tensor:
            mean = vectors[0].clone()
            for vector in vectors[1:]:
                mean.add_(vector)
            mean.div_(len(vectors))
            part = self.combine(fragment, w[start:stop], mean)
            return torch.cat([w[:start], part, w[stop:]])

        async with self.store.lock:
            new = await self.store.compute(merged, self.store.w)
            self._done[fragment] += 1
            self.rounds.append(RoundRecord(fragment, number, self.store.version + 1))
            self.store.commit(new, [(worker, pushes[worker].base_version)
                                    for worker in sorted(pushes)])

    async def on_pull(self, pull: Pull) -> Reply:
        fragment = self.fragment_of(pull.meta)
        number = self._pushed_round.get((fragment, pull.worker))
        if number is None:
            raise WireError(409, f"worker {pull.worker} pulls fragment {fragment} before "
                                 "pushing it")
        await self.store.wait_for(lambda: self._done[fragment] > number, pull.worker)
        start, stop = self.bounds[fragment]
        return Reply(meta={"fragment": fragment, "round": number},
                     vector=self.store.w[start:stop], version=self.store.version)


class DilocoServer(RoundServer):
    """Outer Nesterov SGD on the mean pseudo-gradient, with momentum per fragment."""

    def __init__(self, params: DilocoParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.outer = [FlatSGD(params.outer_lr, params.outer_momentum,
                              nesterov=params.outer_momentum > 0) for _ in self.bounds]

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return current - self.outer[fragment].update(current, mean)


def pseudo_gradient(trainer: Trainer, anchor: torch.Tensor, start: int,
                    stop: int) -> torch.Tensor:
    """``anchor - w_i`` on the slice ``[start, stop)``, as a CPU tensor (compute thread)."""
    return anchor[start:stop] - trainer.flat[start:stop].detach().to("cpu")


class DilocoWorker(WorkerLoop):
    """H inner steps, push ``w - w_i``, adopt the new global model."""

    async def run(self, ctx: WorkerContext) -> None:
        steps = self.params.inner_steps
        anchor = await ctx.in_thread(ctx.trainer.vector_copy)
        while True:
            result = await ctx.steps(steps)
            pseudo = await ctx.in_thread(pseudo_gradient, ctx.trainer, anchor, 0, len(anchor))
            await ctx.push("gradient", pseudo, steps=steps, samples=result.samples)
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)


DILOCO = register(Protocol("diloco", "H inner steps, then outer Nesterov SGD on the mean "
                                     "pseudo-gradient", DilocoParams, DilocoServer,
                           DilocoWorker))
