"""The one round barrier of the SDK, used by every round-based protocol, and vector helpers.

`RoundServer` collects one push per member of a round, then commits the round. The model
may be split into fragments (contiguous slices of the flat vector), each with its own
rounds (Streaming DiLoCo); most protocols have one fragment, the whole vector.

- A round of a fragment waits for its `members` (every live worker by default). A push
  from a worker that is not a member, a second one from the same worker, or (when
  `same_version` holds) one based on another version than the current one, is refused
  as `OutOfStep` and changes nothing.
- When every member has pushed, `close_round` commits: by default the weighted mean of
  the pushed vectors (`weight`, 1 each by default) goes to `combine`, whose result becomes
  the fragment's new value, as one new version.
- A pull of a fragment waits until a round holding the worker's push with at least the
  pull's base version has closed, and answers with the fragment (so a pull may be sent
  before its push: it waits for that push's round).
- A worker that leaves or is lost has its pushes of open rounds withdrawn, and rounds
  whose remaining members have all pushed close at once (not once the run is stopping);
  a worker that (re)joins is a member of the open rounds, which then wait for it.

Hooks for variants: `members`, `take` (check a push), `weight`, `left`, `joined`,
`combine` or `close_round`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from asyncsync.protocols.base import (
    HISTORY,
    BadRequest,
    OutOfStep,
    Pull,
    Push,
    Reply,
    ServerRule,
    brief,
)
from asyncsync.protocols.ports import Contributions, Store


def average(vectors: Sequence[torch.Tensor],
            weights: Sequence[float] | None = None) -> torch.Tensor:
    """``sum_i w_i v_i / sum_i w_i`` (the plain mean without weights) as a new tensor.

    O(model) per vector: call it through ``store.compute``.
    """
    scales = [1.0] * len(vectors) if weights is None else list(weights)
    total = vectors[0] * scales[0]
    for vector, scale in zip(vectors[1:], scales[1:], strict=True):
        total.add_(vector, alpha=scale)
    return total.div_(sum(scales))


def contributions(pushes: dict[int, Push]) -> Contributions:
    """``(worker, base_version)`` of each push, in arrival order (for ``store.commit``)."""
    return [(push.worker, push.base_version) for push in pushes.values()]


@dataclass(frozen=True)
class RoundRecord:
    """One closed round: its fragment and number, the version it made, and each member's
    local steps."""

    fragment: int
    round: int
    version: int
    steps: dict[int, int]


class RoundServer(ServerRule):
    """One barrier per fragment of the model (see the module docstring).

    Attributes:
        same_version: pushes must be based on the current version (true unless other
            fragments' rounds advance the version in between).
        bounds: the fragments' ``(start, stop)`` slices.
        pending: each fragment's open round: its pushes by worker, in arrival order.
        closed: how many rounds each fragment has closed (the open round's number).
        rounds: the most recent closed rounds (at most `HISTORY`).
    """

    same_version: ClassVar[bool] = True

    def __init__(self, params: Any, store: Store) -> None:
        super().__init__(params, store)
        self.bounds = self.fragments()
        self.pending: list[dict[int, Push]] = [{} for _ in self.bounds]
        self.closed = [0] * len(self.bounds)
        self.rounds: deque[RoundRecord] = deque(maxlen=HISTORY)
        self._answered: dict[tuple[int, int], int] = {}  # (fragment, worker) -> base version

    # ---- hooks ---------------------------------------------------------------------------
    def fragments(self) -> list[tuple[int, int]]:
        """The ``(start, stop)`` slices of the flat vector; one, the whole, by default."""
        return [(0, self.store.numel)]

    def members(self, fragment: int) -> Set[int]:
        """The workers the fragment's open round waits for: every live worker."""
        return self.store.live

    def take(self, push: Push) -> None:
        """Check a push about to join a round (raise a `Refused` to refuse it)."""

    def weight(self, push: Push) -> float:
        """A pushed vector's weight in the round's mean: equal for all."""
        return 1.0

    def left(self, worker: int) -> None:
        """Forget what would make others wait for `worker`, which left (under the lock)."""

    def joined(self, worker: int) -> None:
        """Set up `worker`, which (re)joined the run (under the lock)."""

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The fragment's new value from its current value and the round's weighted mean
        (runs in the compute seam); override this or `close_round`."""
        raise NotImplementedError(f"{type(self).__name__} must override combine or close_round")

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        """Commit the round made of `pushes` (under the lock); await only before the commit,
        so that the round is either committed or left as it was."""
        start, stop = self.bounds[fragment]
        vectors = [push.vector for push in pushes.values()]
        weights = [self.weight(push) for push in pushes.values()]
        w = self.store.w

        def merged() -> torch.Tensor:
            part = self.combine(fragment, w[start:stop], average(vectors, weights))
            return part if stop - start == w.numel() else torch.cat([w[:start], part, w[stop:]])

        self.store.commit(await self.store.compute(merged), contributions(pushes))

    # ---- the barrier ---------------------------------------------------------------------
    def fragment_of(self, meta: dict[str, Any]) -> int:
        """The fragment a request names (default 0); anything else is a `BadRequest`."""
        fragment = meta.get("fragment", 0)
        if (not isinstance(fragment, int) or isinstance(fragment, bool)
                or not 0 <= fragment < len(self.bounds)):
            raise BadRequest(f"unknown fragment {brief(fragment)}: this run has fragments "
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
            pending, number = self.pending[fragment], self.closed[fragment]
            if self.same_version and push.base_version != self.store.version:
                raise OutOfStep(f"push based on version {push.base_version}, but the round "
                                f"in progress is at version {self.store.version}")
            if push.worker not in self.members(fragment):
                raise OutOfStep(f"worker {push.worker} does not take part in round {number}"
                                f" of fragment {fragment}")
            if push.worker in pending:
                raise OutOfStep(f"worker {push.worker} already pushed fragment {fragment} "
                                f"for round {number}")
            self.take(push)
            pending[push.worker] = push
            await self._close_if_complete(fragment)
        return {"fragment": fragment, "round": number}

    async def _close_if_complete(self, fragment: int) -> None:
        pushes = self.pending[fragment]
        if not pushes or not pushes.keys() >= self.members(fragment):
            return
        await self.close_round(fragment, pushes)
        self.rounds.append(RoundRecord(fragment, self.closed[fragment], self.store.version,
                                       {w: push.steps for w, push in pushes.items()}))
        for worker, push in pushes.items():
            self._answered[fragment, worker] = push.base_version
        self.pending[fragment] = {}
        self.closed[fragment] += 1

    async def on_pull(self, pull: Pull) -> Reply:
        fragment = self.fragment_of(pull.meta)
        key = (fragment, pull.worker)
        await self.store.wait_for(lambda: self._answered.get(key, -1) >= pull.base_version,
                                  pull.worker)
        start, stop = self.bounds[fragment]
        vector = self.store.w if stop - start == self.store.numel else self.store.w[start:stop]
        return Reply(meta={"fragment": fragment, "round": self.closed[fragment] - 1},
                     vector=vector, version=self.store.version)

    async def on_leave(self, worker: int) -> None:
        async with self.store.lock:
            for pending in self.pending:
                pending.pop(worker, None)
            self.left(worker)
            for fragment in range(len(self.bounds)):
                await self._close_if_complete(fragment)

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            for fragment in range(len(self.bounds)):
                self._answered.pop((fragment, worker), None)
            self.joined(worker)
