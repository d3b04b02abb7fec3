"""DiLoCo: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient.

Worker: starting from the global model ``w``, run H local (inner) SGD steps, push the
pseudo-gradient ``g_i = w - w_i``, pull the next global model and adopt it. Server: when
the pseudo-gradients of every live worker are in, ``w <- w - outer.update(w, mean_i g_i)``
where
``outer`` is SGD with Nesterov momentum (lr 0.7, momentum 0.9), version += 1, and the pulls
are released. Outer momentum 0 gives plain outer SGD (lr 1 is then local SGD's averaging).
The inner optimizer is the worker's local SGD (the paper uses AdamW).

The round barrier is `RoundServer`: one vector per live worker per round of each
*fragment* of the model (DiLoCo has one fragment, the whole vector); Overlap Local SGD and
Streaming DiLoCo reuse it with their own `RoundServer.combine`. A lost worker's vectors
in open rounds are withdrawn and the rounds close with the others'; a rejoined worker
takes part in the rounds still open, starting from the global model it joined with. The
outer optimizer's momentum is part of the server's checkpoint.

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
from asyncsync.protocols.bsp import average
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
    """A barrier per fragment: each round takes one vector per live worker, then `combine`s.

    Fragments are contiguous slices of the flat vector (`fragments`); a request names its
    fragment in ``meta["fragment"]`` (default 0). A pull waits for the round of the
    worker's last push of that fragment and answers with that fragment of ``w``.

    Membership: when a worker leaves or is lost, its vectors in open rounds are withdrawn
    and every round whose live workers have all pushed closes (unless the run is stopping).
    A rejoined worker's next
    push of a fragment belongs to that fragment's open round, which waits for it; a push
    based on a version older than the one its worker last joined at comes from before the
    rejoin and is refused (409). A push or a leave is processed to its end even if its
    request is cancelled, and a join waits for a round being committed.

    Attributes:
        rounds: every completed round, in commit order.
    """

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: Any, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.bounds = self.fragments()
        self.rounds: list[RoundRecord] = []
        self._pending: list[dict[int, Push]] = [{} for _ in self.bounds]
        self._done = [0] * len(self.bounds)  # closed rounds: the number of the open one
        self._pushed_round: dict[tuple[int, int], int] = {}
        self._joined: dict[int, int] = {}

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
        async with self.store.lock:
            pending = self._pending[fragment]
            number = self._done[fragment]
            joined = self._joined.get(push.worker, 0)
            if push.base_version < joined:
                raise WireError(409, f"push based on version {push.base_version}, before "
                                     f"worker {push.worker} rejoined at version {joined}")
            if push.worker in pending:
                raise WireError(409, f"worker {push.worker} already pushed fragment "
                                     f"{fragment} for round {number}")
            pending[push.worker] = push
            self._pushed_round[fragment, push.worker] = number
            await self._close_if_complete(fragment)
        return {"fragment": fragment, "round": number}

    async def _close_if_complete(self, fragment: int) -> None:
        """Close the fragment's open round if every live worker has pushed (under the lock)."""
        pushes = self._pending[fragment]
        if not pushes or not pushes.keys() >= self.store.live:
            return
        start, stop = self.bounds[fragment]
        vectors = [pushes[worker].vector for worker in sorted(pushes)]

        def merged(w: torch.Tensor) -> torch.Tensor:
            part = self.combine(fragment, w[start:stop], average(vectors))
            return torch.cat([w[:start], part, w[stop:]])

        new = await self.store.compute(merged, self.store.w)
        self.rounds.append(RoundRecord(fragment, self._done[fragment], self.store.version + 1))
        self._pending[fragment] = {}
        self._done[fragment] += 1
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

    async def on_leave(self, worker: int) -> None:
        async with self.store.lock:
            for fragment, pending in enumerate(self._pending):
                if pending.pop(worker, None) is not None:
                    del self._pushed_round[fragment, worker]
                await self._close_if_complete(fragment)

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            self._joined[worker] = self.store.version


class DilocoServer(RoundServer):
    """Outer Nesterov SGD on the mean pseudo-gradient, with momentum per fragment.

    Lost and rejoining workers are handled by `RoundServer`; the outer momentum buffers are
    the rule's checkpoint state.
    """

    def __init__(self, params: DilocoParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        self.outer = [FlatSGD(params.outer_lr, params.outer_momentum,
                              nesterov=params.outer_momentum > 0) for _ in self.bounds]

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return current - self.outer[fragment].update(current, mean)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The outer momentum buffer of each fragment that has one."""
        return {f"outer.{fragment}.momentum": outer.momentum_buffer
                for fragment, outer in enumerate(self.outer)
                if outer.momentum_buffer is not None}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for fragment, outer in enumerate(self.outer):
            buffer = state.get(f"outer.{fragment}.momentum")
            if buffer is not None:
                start, stop = self.bounds[fragment]
                if buffer.shape != (stop - start,):
                    raise ValueError(f"outer momentum of fragment {fragment} has shape "
                                     f"{tuple(buffer.shape)}, the fragment {stop - start} "
                                     "elements")
                outer.momentum_buffer = buffer.clone()


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
