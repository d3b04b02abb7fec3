"""The parameter store: the global vector, its versions, and the waits on them.

Implements the SDK's `Store` port. The vector is replaced on each commit (never written
in place), so a refused request cannot change it and a pull can stream an old version
while the next is made. New vectors (received pushes, `apply_gradient`'s results) come
from `buffers`, a pool of warm memory: a version's memory is reused once no pull streams
it and no rule holds it any more (`asyncsync.training.buffers`). Commits are counted, and the
most recent kept for inspection.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, KeysView, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import torch

from asyncsync.clock import Stopwatch
from asyncsync.engine.compute import ServerSeam, ThreadedServerSeam
from asyncsync.protocols.base import (
    NotInRun,
    Reply,
    RunStopped,
    ServerRule,
    Unacceptable,
    all_finite,
    unchanged_if_refused,
    wide_history,
)
from asyncsync.protocols.ports import Contributions, LiveSet
from asyncsync.training.buffers import VectorPool
from asyncsync.training.optim import FlatSGD

T = TypeVar("T")


@dataclass(frozen=True)
class Commit:
    """One new version: who contributed, from which base versions."""

    version: int
    contributions: Contributions


@dataclass
class StalenessStats:
    """Staleness of applied updates (version at apply time - base version)."""

    count: int = 0
    total: int = 0
    maximum: int = 0

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        self.maximum = max(self.maximum, value)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


class RuleLock(asyncio.Lock):
    """The store's lock, which makes a rule's refusals change nothing of its state.

    Rules hold it while they read and commit; each hold takes a snapshot of `rule`'s
    state, put back when a `Refused` leaves the lock (`unchanged_if_refused`).

    Attributes:
        rule: the rule whose state is kept (None: nothing is kept).
    """

    def __init__(self) -> None:
        super().__init__()
        self.rule: ServerRule | None = None
        self._guard: AbstractContextManager[None] | None = None

    async def __aenter__(self) -> None:
        await super().__aenter__()
        if self.rule is not None:
            self._guard = unchanged_if_refused(self.rule)
            self._guard.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        guard, self._guard = self._guard, None
        try:
            if guard is not None:
                guard.__exit__(kind, exc, traceback)
        finally:
            await super().__aexit__(kind, exc, traceback)


@dataclass(eq=False)
class _Waiter:
    """A request held by `ParameterStore.wait_for`: its condition, its worker, and the
    future that resumes it."""

    ready: Callable[[], bool]
    worker: int
    session: int
    woken: asyncio.Future[None]


class ParameterStore:
    """The global vector and its versions; the only way a rule changes the model.

    Attributes:
        live: the ranks in the run now (joined, not left or lost); barriers count these.
        held: the ranks with a request `wait_for` holds now (a rank may have several).
        commits: the most recent commits (at most `wide_history(workers)`: a barrier's
            names every worker); `version` counts them all.
        held_s: seconds each worker's requests were held in `wait_for`.
        buffers: the pool of model-sized vectors (pushes are received into it).
        run_time: the run's clock (seconds since the run started).
    """

    def __init__(self, vector: torch.Tensor, workers: int, optimizer: FlatSGD,
                 num_params: int | None = None, seam: ServerSeam | None = None,
                 frozen: Sequence[slice] = ()) -> None:
        self.w = vector
        self.numel = vector.numel()
        self.num_params = self.numel if num_params is None else num_params
        self.frozen = list(frozen)
        """The slices of parameters without ``requires_grad``: a gradient step leaves
        them as they are, weight decay included (as the workers' local steps do)."""
        self.version = 0
        self.workers = workers
        self.optimizer = optimizer
        self.seam = seam or ThreadedServerSeam(self.numel)
        # a round holds one push per worker: keep that many warm for the next round
        self.buffers = VectorPool(keep=workers + 2, track=2 * workers + 8)
        self._lock = RuleLock()
        self.lock: asyncio.Lock = self._lock
        self.stopping = False
        self.commits: deque[Commit] = deque(maxlen=wide_history(workers))
        self.staleness = StalenessStats()
        self.live = LiveSet()
        self._held: Counter[int] = Counter()  # requests held, per rank
        self.held_s: dict[int, float] = {}
        self.run_time = Stopwatch()
        self._waiting: dict[_Waiter, None] = {}  # in the order they began to wait
        self._sessions: dict[int, int] = {}  # per rank: how many times it was dropped
        self._check_queued = False

    @property
    def held(self) -> KeysView[int]:
        return self._held.keys()

    @property
    def membership(self) -> int:
        return self.live.changes

    def keep_state_of(self, rule: ServerRule) -> None:
        """Make a `Refused` raised under the lock put `rule`'s state back (`RuleLock`)."""
        self._lock.rule = rule

    def now(self) -> float:
        return self.run_time.elapsed()

    def current(self) -> Reply:
        return Reply(vector=self.w, version=self.version)

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.seam.math(fn, *args)

    async def apply_gradient(self, gradient: torch.Tensor, contributions: Contributions) -> None:
        self._check_locked()
        n = self.num_params

        def step() -> tuple[torch.Tensor, torch.Tensor | None, bool]:
            new = self.buffers.take(self.numel, self.w.dtype)
            buffer = self.optimizer.apply_into(new[:n], self.w[:n], gradient[:n])
            for columns in self.frozen:
                new[columns] = self.w[columns]
                if buffer is not None:
                    buffer[columns] = 0.0
            new[n:] = gradient[n:]
            return new, buffer, all_finite(new) and (buffer is None or all_finite(buffer))

        new, buffer, finite = await self.compute(step)
        if not finite:
            raise Unacceptable(NONFINITE_RESULT)
        self.optimizer.momentum_buffer = buffer
        self._publish(new, contributions)

    def commit(self, vector: torch.Tensor, contributions: Contributions) -> None:
        self._check_locked()
        if vector is not self.w and not all_finite(vector):
            raise Unacceptable(NONFINITE_RESULT)
        self._publish(vector, contributions)

    def _check_locked(self) -> None:
        """Refuse a change made without ``lock``: two updates could read the same model."""
        if not self._lock.locked():
            raise RuntimeError("a rule committed without holding store.lock: two updates "
                               "could read the same model and one of them be lost")

    def _publish(self, vector: torch.Tensor, contributions: Contributions) -> None:
        for _, base in contributions:
            self.staleness.add(self.version - base)
        self.w = vector
        self.version += 1
        self.commits.append(Commit(self.version, contributions))
        self.notify()

    def drop(self, worker: int) -> None:
        """Take `worker` out of `live` and end its session's held requests (`wait_for`
        raises `NotInRun` in them), even when a new session of the rank joins before they
        wake: a request of a session taken over is not answered in the new one's name."""
        self.live.discard(worker)
        self._sessions[worker] = self._sessions.get(worker, 0) + 1
        self.notify()

    def _gone(self, worker: int, session: int) -> bool:
        """Whether the session of `worker` whose drop count was `session` has ended."""
        return worker not in self.live or self._sessions.get(worker, 0) != session

    def notify(self) -> None:
        """Have the held requests check their conditions, once what runs now is done.

        One callback checks every condition, in the order the requests began to wait, and
        resumes only the requests whose condition holds, or whose run is stopping or whose
        worker is gone; the others wait on, never resumed. Resuming each held request at
        every notify (an `asyncio.Event`'s way) cost a fifth of a 1,000-client FedAvg round
        with 50 clients sampled: the 950 idle pulls woke twice a round to wait again.
        """
        if self._waiting and not self._check_queued:
            self._check_queued = True
            asyncio.get_running_loop().call_soon(self._resume_ready)

    def _resume_ready(self) -> None:
        self._check_queued = False
        for waiter in list(self._waiting):
            try:
                due = (self.stopping or self._gone(waiter.worker, waiter.session)
                       or waiter.ready())
            except Exception:  # the request raises it itself, as it checks again
                due = True
            if due:
                del self._waiting[waiter]
                if not waiter.woken.done():
                    waiter.woken.set_result(None)

    async def wait_for(self, ready: Callable[[], bool], worker: int) -> None:
        if ready():
            return
        self._held[worker] += 1
        began = self.now()
        session = self._sessions.get(worker, 0)
        try:
            while self._gone(worker, session) or not ready():  # (gone first: see `drop`)
                if self.stopping:
                    raise RunStopped
                if self._gone(worker, session):
                    raise NotInRun(f"worker {worker} was dropped (timed out, left or taken "
                                   "over) while its request waited")
                waiter = _Waiter(ready, worker, session,
                                 asyncio.get_running_loop().create_future())
                self._waiting[waiter] = None
                try:
                    await waiter.woken
                finally:
                    self._waiting.pop(waiter, None)
        finally:
            self._held[worker] -= 1
            if not self._held[worker]:
                del self._held[worker]
            self.held_s[worker] = self.held_s.get(worker, 0.0) + self.now() - began

    def stop(self) -> None:
        self.stopping = True
        self.notify()


NONFINITE_RESULT = ("the update would make the global model or the optimizer's state "
                    "non-finite; refused, the model is unchanged")

