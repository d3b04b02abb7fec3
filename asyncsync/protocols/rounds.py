"""The one round barrier of the SDK, used by every round-based protocol, and vector helpers.

`RoundServer` collects one push per member of a round, then commits the round. The model
may be split into fragments (contiguous slices of the flat vector), each with its own
rounds (Streaming DiLoCo); most protocols have one fragment, the whole vector.

- A round of a fragment waits for its `members` (every live worker by default). A push from a
  non-member, a second one from the same worker, or (when `same_version` holds) one based
  on another version than the current one, is refused as `OutOfStep` and changes nothing.
- When every member has pushed, `close_round` commits: by default the pushed vectors' mean
  weighted by `weight` (1 each) goes to `combine`, whose result is the fragment's new value.
- A pull of a fragment waits until a round holding the worker's push with at least the
  pull's base version has closed, and answers with the fragment (so a pull may be sent
  before its push: it waits for that push's round).
- A round whose result the store refuses as non-finite (finite pushes can still add up
  to an overflow) is discarded: the model stays as it was and is published as the
  round's version, so its workers go on; the round's record says so (`refused`).
- A push that arrived counts though its worker then leaves or is lost; rounds holding
  every live member's push then close at once (not once the run is stopping). A worker
  that (re)joins is a member of the open rounds, which wait for it; a push of it that
  they hold is withdrawn (it pushes anew), and a round left with none starts afresh.

Backup workers and deadlines (J. Chen, X. Pan, R. Monga, S. Bengio, R. Jozefowicz,
"Revisiting Distributed Synchronous SGD", arXiv:1604.00981, 2016): a protocol whose
parameter dataclass derives from `Cutoff` lets a round close before every member pushed.

- With ``backup_workers = b`` a round closes as soon as ``M - b`` of its M members have
  pushed (the first ones to arrive; at least one).
- With ``deadline_s = d > 0`` a round also closes ``d`` seconds after its first push, with
  what has arrived by then **(choice)**: timed from the first push rather than from the
  round's opening, so that `d` is the patience granted to stragglers whatever the step
  time is, and a round never closes empty. The timer is a loop timer, so it runs on the
  run's clock (virtual in virtual mode); a report that arrives at the deadline's instant
  is on time (`ON_TIME_S`).
- A push based on an older version than the current one is then *late* (its round closed
  without it): it is dropped, counted in `late` (per worker), answered with meta
  ``late: True``, and the worker's pull is answered with the current model, so the late
  worker carries on from the newest version (no refusal, hence no rejoin). The members a
  round closed without are in its `RoundRecord.missing`.

Over-selection (K. Bonawitz et al., "Towards Federated Learning at Scale: System Design",
MLSys 2019, which selects 130% of the devices a round needs) and adaptive deadlines:

- With ``overcommit = o > 0`` a round closes with its first k reports and drops the rest
  as late: k is what the rule draws the round for (FedAvg: its ``max(1, round(C n))``
  sampled workers, of which it draws ``ceil(k (1 + o))``), else ``ceil(M / (1 + o))`` of
  the round's M members (every live worker takes part, so no more can be drawn).
- With ``deadline_quantile = q`` or ``deadline_mad_k = k``, a round's deadline (timed from
  its first push, as ``deadline_s``) is the q-quantile, or the median plus k MADs, of the
  last ``deadline_window`` rounds' durations (`asyncsync.protocols.deadlines`); until three
  rounds are known, rounds wait for every member.

Every report dropped by these policies is counted in `late` (the run's ``dropped``).
Late pushes are recognised by their base version, so only protocols whose pushes are
based on the current version (`same_version`) may use any of these.

The options (`Cutoff`, `CUTOFF_OPTIONS`) live in `deadlines`, re-exported here.

Hooks for variants: `members`, `take`, `weight`, `left`, `joined`, `combine` or `close_round`.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from asyncsync.protocols.base import (
    BadRequest,
    OutOfStep,
    P,
    Pull,
    Push,
    Reply,
    ServerRule,
    Unacceptable,
    brief,
    unchanged_if_refused,
    wide_history,
)
from asyncsync.protocols.deadlines import CUTOFF_OPTIONS as CUTOFF_OPTIONS
from asyncsync.protocols.deadlines import Cutoff as Cutoff
from asyncsync.protocols.deadlines import RoundDurations
from asyncsync.protocols.ports import Contributions, Store

ON_TIME_S = 1e-6
"""A report that arrives within a microsecond of its round's deadline is on time. On the
virtual clock a steady straggler's report arrives at the very instant an adaptive deadline
lands on, and the deadline's timer, armed first, won that tie every round; firing it a
microsecond later (more than the loop's clock resolution, 1 ns on Linux) lets everything
due at the instant run first."""


def average(vectors: Sequence[torch.Tensor], weights: Sequence[float] | None = None,
            in_place: bool = False) -> torch.Tensor:
    """``sum_i w_i v_i / sum_i w_i`` (the plain mean without weights).

    A new tensor, or with `in_place` the first vector itself, overwritten (for a rule
    discarding the vectors it averages, e.g. a round's pushes: no new model-sized
    tensor; the mean of one vector is then that vector, untouched).
    Each vector is scaled by its share before it is added, so every partial sum is a part
    of a convex combination: finite vectors never overflow on the way to their mean.
    O(model) per vector: call it through ``store.compute``.
    """
    scales = [1.0] * len(vectors) if weights is None else list(weights)
    total_weight = sum(scales)
    first = scales[0] / total_weight
    if not in_place:
        total = vectors[0] * first
    elif first != 1.0:
        total = vectors[0].mul_(first)
    else:
        total = vectors[0]
    for vector, scale in zip(vectors[1:], scales[1:], strict=True):
        total.add_(vector, alpha=scale / total_weight)
    return total


def contributions(pushes: dict[int, Push]) -> Contributions:
    """``(worker, base_version)`` of each push, in arrival order (for ``store.commit``)."""
    return [(push.worker, push.base_version) for push in pushes.values()]


@dataclass(frozen=True)
class RoundRecord:
    """One closed round: its fragment and number, the version it made, each member's
    local steps, the members it closed without (backup workers, deadline), and whether
    its result was refused as non-finite (the model was left as it was)."""

    fragment: int
    round: int
    version: int
    steps: dict[int, int]
    missing: frozenset[int] = field(default_factory=frozenset)
    refused: bool = False
    deadline_s: float | None = None


class RoundServer(ServerRule[P]):
    """One barrier per fragment of the model (see the module docstring).

    Attributes:
        same_version: pushes must be based on the current version (true unless other
            fragments' rounds advance the version in between).
        bounds: the fragments' ``(start, stop)`` slices.
        pending: each fragment's open round: its pushes by worker, in arrival order.
        closed: how many rounds each fragment has closed (the open round's number).
        rounds: the most recent closed rounds (at most `wide_history(workers)`).
        cutoff: when a round may close early (from the parameters when they derive from
            `Cutoff`, else never); late: late pushes dropped, per worker.
        wanted: the reports an over-selected round closes with, when the rule draws its
            members for a count (None: from the members, see the module docstring).
        durations: recent round durations, with an adaptive deadline (else None).
    """

    same_version: ClassVar[bool] = True

    def __init__(self, params: Any, store: Store) -> None:
        super().__init__(params, store)
        self.bounds = self.fragments()
        self.pending: list[dict[int, Push]] = [{} for _ in self.bounds]
        self.closed = [0] * len(self.bounds)
        self.rounds: deque[RoundRecord] = deque(maxlen=wide_history(store.workers))
        self.cutoff = params if isinstance(params, Cutoff) else Cutoff()
        self.cutoff.check_workers(store.workers)
        if self.cutoff.cuts and not self.same_version:
            raise ValueError(f"{type(self).__name__}: its pushes are not all based on the "
                             "current version, so rounds cannot drop late ones (backup "
                             "workers, deadlines and over-selection are not offered)")
        self.late: dict[int, int] = {}
        self.wanted: int | None = None
        self.durations = (RoundDurations(self.cutoff.deadline_window,
                                         self.cutoff.deadline_quantile,
                                         self.cutoff.deadline_mad_k)
                          if self.cutoff.adaptive else None)
        self._deadlines: list[float | None] = [None] * len(self.bounds)
        self._answered: dict[tuple[int, int], int] = {}  # (fragment, worker) -> base version
        self._timers: list[asyncio.TimerHandle | None] = [None] * len(self.bounds)
        self._expiring: set[asyncio.Task[None]] = set()  # deadline closes under way

    # ---- hooks ---------------------------------------------------------------------------
    def fragments(self) -> list[tuple[int, int]]:
        """The ``(start, stop)`` slices of the flat vector; one, the whole, by default."""
        return [(0, self.store.numel)]

    def members(self, fragment: int) -> Set[int]:
        """The workers the fragment's open round waits for: every live worker."""
        return self.store.live

    def quorum(self, fragment: int, members: int | None = None) -> int:
        """How many pushes close the open round of M `members` (default: those of
        `members()` and the departed whose push arrived, which counts); it grows with M."""
        if members is None:
            live = self.members(fragment)
            members = len(live) + sum(w not in live for w in self.pending[fragment])
        if self.cutoff.overcommit:
            wanted = self.wanted or math.ceil(members / (1 + self.cutoff.overcommit))
            return max(1, min(wanted, members))
        return members - self.cutoff.backup_workers

    def dropped(self) -> int:
        """Reports dropped so far because their round closed without them."""
        return sum(self.late.values())

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
                if push.base_version < self.store.version and self.cutoff.cuts:
                    return self._drop_late(fragment, push)
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
            if len(pending) == 1:
                self._arm(fragment)
            if self.durations is not None:
                self.durations.report((fragment, push.base_version), self.store.now())
            await self._close_if_complete(fragment)
        return {"fragment": fragment, "round": number}

    def _drop_late(self, fragment: int, push: Push) -> dict[str, Any]:
        """Count and drop a push whose round closed without it; its pull is answered."""
        self.late[push.worker] = self.late.get(push.worker, 0) + 1
        if self.durations is not None:
            self.durations.report((fragment, push.base_version), self.store.now(), late=True)
        key = (fragment, push.worker)
        self._answered[key] = max(self._answered.get(key, -1), push.base_version)
        self.store.notify()
        return {"fragment": fragment, "late": True}

    async def _close_if_complete(self, fragment: int) -> None:
        pushes = self.pending[fragment]  # (the exact quorum is O(pushes): once its floor is)
        floor = self.quorum(fragment, len(self.members(fragment)))
        if pushes and len(pushes) >= floor and len(pushes) >= self.quorum(fragment):
            await self._close(fragment)

    async def _close(self, fragment: int) -> None:
        """Commit the open round of `fragment` with the pushes it has (at least one)."""
        pushes = self.pending[fragment]
        missing = frozenset(self.members(fragment) - pushes.keys())
        try:
            with unchanged_if_refused(self):
                await self.close_round(fragment, pushes)
            refused = False
        except Unacceptable:
            self.store.commit(self.store.w, contributions(pushes))
            refused = True
        self._disarm(fragment)
        self.rounds.append(RoundRecord(fragment, self.closed[fragment], self.store.version,
                                       {w: push.steps for w, push in pushes.items()},
                                       missing, refused, self._deadlines[fragment]))
        for worker, push in pushes.items():
            self._answered[fragment, worker] = push.base_version
        self.pending[fragment] = {}
        self.closed[fragment] += 1

    # ---- the deadline --------------------------------------------------------------------
    def _arm(self, fragment: int) -> None:
        """Start the open round's deadline, if it has one (at its first push)."""
        deadline = (self.durations.deadline() if self.durations is not None
                    else self.cutoff.deadline_s or None)
        self._deadlines[fragment] = deadline
        if deadline is not None:
            self._timers[fragment] = asyncio.get_running_loop().call_later(
                deadline + ON_TIME_S, self._expire, fragment)

    def _disarm(self, fragment: int) -> None:
        timer = self._timers[fragment]
        if timer is not None:
            timer.cancel()
            self._timers[fragment] = None

    def _expire(self, fragment: int) -> None:
        """The deadline fired; its close waits for the lock, void if the deadline was
        disarmed or replaced meanwhile (the round closed, or its pushes were withdrawn)."""
        task = asyncio.create_task(self._close_at_deadline(fragment, self._timers[fragment]))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _close_at_deadline(self, fragment: int, armed: object) -> None:
        async with self.store.lock:
            if self._timers[fragment] is armed and self.pending[fragment]:
                await self._close(fragment)

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
        """Keep the worker's arrived pushes; close the rounds they now complete."""
        async with self.store.lock:
            self.left(worker)
            for fragment in range(len(self.bounds)):
                await self._close_if_complete(fragment)

    async def on_join(self, worker: int) -> None:
        """Withdraw the worker's pushes that open rounds hold (it pushes anew)."""
        async with self.store.lock:
            for fragment, pending in enumerate(self.pending):
                self._answered.pop((fragment, worker), None)
                if pending.pop(worker, None) is not None and not pending:
                    self._disarm(fragment)
                    if self.durations is not None:
                        self.durations.forget((fragment, self.store.version))
            self.joined(worker)
