"""A test kit for protocol authors: a store and a context that stand in for the engine.

`FakeStore` implements the `Store` port in memory and changes membership as the engine
does (`join` adds a rank to ``live`` and calls the rule's `on_join`; `leave` removes it,
calls `on_leave` and wakes waiters). `leave` ends the worker's session, as the engine's
`ParameterStore.drop` does when a worker is lost or a restarted copy takes its rank over:
a request of it held in the rule (`wait_for`) raises `NotInRun` (the engine answers 410),
even when ``join`` readmits the rank before the request wakes, so a test of a takeover
sees the old session's pull end rather than be answered in the new session's name.
`FakeContext` implements the `Context` port over a
`FakeStore` and its rule: its pushes and pulls go straight to the rule, and its local
model is a flat vector that each local step moves by ``lr * grad_fn(local)``. Both are
SDK-only, so a rule or a loop can be tested without the engine, a transport or a model;
`asyncsync.study.simulation.run_virtual` runs whole protocols in virtual time.

The kit refuses what the engine refuses, with the same refusal classes: a push of a kind
the rule does not accept, of the wrong length (`ServerRule.tensor_numel`), with NaN or Inf,
claiming more than ``steps x max_batch`` samples, based on a version ahead of the store's
or computed before its worker last rejoined (`FakeContext.push`); a commit whose result
is non-finite (`FakeStore.commit`). Its lock puts the rule's state back when a `Refused`
leaves it, as the engine's does. A ``gradient(copy=False)`` is one vector, overwritten by
every computation, as the trainer's is; `adopt` copies its vector only at the next
computation, as the engine's does (a write into the adopted vector before then changes
the local model). Two mistakes fail a kit test with an `AssertionError`: a rule that
writes into ``store.w`` in place (which the engine cannot see), and one that commits
without holding ``store.lock``; a loop that swallows `RunStopped` and goes on fails with
`LoopWentOn` (in a run its worker would never end).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import torch

from asyncsync.errors import LoopWentOn as LoopWentOn  # (the kit's name, re-exported)
from asyncsync.protocols.base import ServerRule, all_finite, unchanged_if_refused
from asyncsync.protocols.messages import (
    BadRequest,
    NotInRun,
    OutOfStep,
    Pull,
    Push,
    Reply,
    RunStopped,
    Unacceptable,
    brief,
)
from asyncsync.protocols.ports import Context, Contributions, LiveSet, StepResult, Store

T = TypeVar("T")


NONFINITE_RESULT = "the update would make the global model non-finite; refused, unchanged"


class RuleLock(asyncio.Lock):
    """A lock that puts `rule`'s state back when a `Refused` leaves it (as the engine's)."""

    def __init__(self) -> None:
        super().__init__()
        self.rule: ServerRule[Any] | None = None
        self._guards: list[Any] = []

    async def __aenter__(self) -> None:
        await super().__aenter__()
        guard = None if self.rule is None else unchanged_if_refused(self.rule)
        if guard is not None:
            guard.__enter__()
        self._guards.append(guard)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        guard = self._guards.pop()
        try:
            if guard is not None:
                guard.__exit__(kind, exc, traceback)
        finally:
            await super().__aexit__(kind, exc, traceback)


@dataclass(frozen=True)
class Commit:
    """One commit of a `FakeStore`: the version it made, and who contributed."""

    version: int
    contributions: Contributions


class FakeStore:
    """The `Store` port in memory: commits are kept in `commits`, time is `clock`.

    `apply_gradient` is plain SGD with rate `lr` on the leading `num_params` elements (the
    rest are buffers, which the gradient's slots replace). The lock keeps the state of the
    rule named by `keep_state_of` (`FakeContext`, `join` and `leave` name theirs).
    """

    def __init__(self, vector: torch.Tensor, workers: int, lr: float = 1.0,
                 num_params: int | None = None, live: Iterable[int] | None = None) -> None:
        self.w = vector
        self.numel = vector.numel()
        self.num_params = self.numel if num_params is None else num_params
        self.version = 0
        self.workers = workers
        self.lr = lr
        self._lock = RuleLock()
        self.lock: asyncio.Lock = self._lock
        self.clock = 0.0
        self.stopping = False
        self.commits: list[Commit] = []
        self.joined_at: dict[int, int] = {}
        """The version each worker that `join` admitted (re)joined at."""
        self._live = LiveSet(range(workers) if live is None else live)
        self._sessions: dict[int, int] = {}  # per worker: how many of its sessions ended
        self._changed = asyncio.Event()
        self._published = (vector, vector.clone())

    def keep_state_of(self, rule: ServerRule[Any]) -> None:
        """Make a `Refused` raised under the lock put `rule`'s state back."""
        self._lock.rule = rule

    def _check_locked(self) -> None:
        if not self.lock.locked():
            raise AssertionError("a commit outside `async with store.lock`: two pushes "
                                 "could read the same model and one update be lost")

    def _check_untouched(self) -> None:
        published, copy = self._published  # (a test may set `w` itself, as a resume does)
        if self.w is published and not torch.equal(self.w, copy):
            raise AssertionError("the rule wrote into store.w in place: the engine may still "
                                 "be sending it to a reader; make a new tensor and commit it")

    @property
    def live(self) -> Set[int]:
        return self._live

    @property
    def membership(self) -> int:
        return self._live.changes

    def now(self) -> float:
        return self.clock

    def current(self) -> Reply:
        self._check_untouched()
        return Reply(vector=self.w, version=self.version)

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def apply_gradient(self, gradient: torch.Tensor, contributions: Contributions) -> None:
        self._check_locked()
        n = self.num_params
        new = gradient.clone()
        new[:n] = self.w[:n] - self.lr * gradient[:n]
        self.commit(new, contributions)

    def commit(self, vector: torch.Tensor, contributions: Contributions) -> None:
        self._check_locked()
        self._check_untouched()
        if vector is not self.w and not all_finite(vector):
            raise Unacceptable(NONFINITE_RESULT)
        self.w = vector
        self._published = (vector, vector.clone())
        self.version += 1
        self.commits.append(Commit(self.version, list(contributions)))
        self.notify()

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, ready: Callable[[], bool], worker: int) -> None:
        session = self._sessions.get(worker, 0)
        while not ready():
            if self.stopping:
                raise RunStopped
            if worker not in self._live or self._sessions.get(worker, 0) != session:
                raise NotInRun(f"worker {worker} was dropped (left or taken over) while its "
                               "request waited")
            await self._changed.wait()

    async def join(self, rule: ServerRule[Any], worker: int) -> None:
        """`worker` (re)joins a running run, as the engine admits it."""
        self.keep_state_of(rule)
        self._live.add(worker)
        self.joined_at[worker] = self.version
        await rule.on_join(worker)
        self.notify()

    async def leave(self, rule: ServerRule[Any], worker: int) -> None:
        """`worker` leaves or is lost, as the engine drops it: its session ends, and its
        requests held in `wait_for` raise `NotInRun`, even if it rejoins before they wake."""
        self.keep_state_of(rule)
        self._live.discard(worker)
        self._sessions[worker] = self._sessions.get(worker, 0) + 1
        if not self.stopping:
            await rule.on_leave(worker)
        self.notify()

    def stop(self) -> None:
        """End the run: every waiter raises `RunStopped`."""
        self.stopping = True
        self.notify()


PLAIN = (str, int, float, bool, bytes, type(None))
"""What a reply's meta may hold at its leaves (the wire is msgpack, not pickle)."""


def wire_meta(hook: str, meta: Any) -> dict[str, Any]:
    """`meta` if the engine can send it: a dict with str keys of `PLAIN` values, lists and
    dicts of them; else a `TypeError` naming the hook and the key (the engine fails the
    reply after the rule has changed the model)."""
    if not isinstance(meta, dict):
        raise TypeError(f"{hook} returned a {type(meta).__name__}, not a dict of reply meta")
    pending: list[tuple[str, Any]] = [(key, value) for key, value in meta.items()]
    while pending:
        path, value = pending.pop()
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise TypeError(f"{hook}: reply meta {path!r} has a key that is not a str")
            pending.extend((f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            pending.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif not isinstance(value, PLAIN):
            raise TypeError(f"{hook}: reply meta {path!r} is a {type(value).__name__}; the "
                            "wire carries str, int, float, bool, bytes, None, lists and dicts")
    return meta


def _toward_zero(local: torch.Tensor) -> torch.Tensor:
    """The default loss's gradient: ``|w|^2 / 2`` has gradient w."""
    return local


@dataclass
class FakeContext:
    """The `Context` port over a `FakeStore` and its rule, for testing a `WorkerLoop`.

    The local model is `local` (the store's model at first). A local step subtracts
    ``lr * grad_fn(local)`` and takes `step_s` seconds of the store's clock, and then yields
    to the event loop, as the engine's step awaits its computation: a background exchange
    (`overlap.Transfers`) or another worker's loop runs between two steps. A computation
    whose steps would pass `max_steps` raises `RunStopped` before any of them, as the
    engine's context does. `shard_size` is the size the context reports for the worker's
    data shard (None: unknown). Pushes are checked as the engine checks them (`max_batch`
    as its setting), go to the rule's `on_push` and are recorded in `pushed`; pulls and
    queries go to the rule.
    """

    store: FakeStore
    rule: ServerRule[Any]
    rank: int = 0
    max_steps: int = 100
    batch_size: int = 16
    max_batch: int = 65536
    shard_size: int | None = None
    lr: float = 0.1
    step_s: float = 0.001
    grad_fn: Callable[[torch.Tensor], torch.Tensor] = _toward_zero
    done: int = 0
    version: int = 0
    pushed: list[Push] = field(default_factory=list)
    local: torch.Tensor = field(init=False)
    workers: int = field(init=False)
    numel: int = field(init=False)
    _grad: torch.Tensor = field(init=False, repr=False)
    _adopted: torch.Tensor | None = field(init=False, default=None, repr=False)
    _stopped: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        self.local = self.store.w.clone()
        self.workers = self.store.workers
        self.numel = self.store.numel
        self._grad = torch.zeros_like(self.local)
        self.store.keep_state_of(self.rule)

    def _settle(self) -> None:
        """Load an adopted vector, as the engine does before its next computation."""
        if self._adopted is not None:
            self.local, self._adopted = self._adopted.clone(), None

    def _check_budget(self, count: int) -> None:
        self._check_going()
        if self.done + count > self.max_steps:
            self._stopped = True
            raise RunStopped

    def _check_going(self) -> None:
        """Fail a loop that swallowed `RunStopped` and went on (in a run it would never
        end): with a `BaseException`, which no ``except Exception`` swallows again."""
        if self._stopped:
            raise LoopWentOn("the loop went on after RunStopped (a bare `except Exception` "
                             "swallows it): in a run its worker would never end")

    def _step(self, correction: torch.Tensor | None,
              proximal: tuple[torch.Tensor, float] | None) -> torch.Tensor:
        self.done += 1
        self.store.clock += self.step_s
        grad = self.grad_fn(self.local).clone()
        if correction is not None:
            grad += correction
        if proximal is not None:
            grad += proximal[1] * (self.local - proximal[0])
        self._grad.copy_(grad)  # the trainer's gradient storage, rewritten every step
        return grad

    async def gradient(self, batch_size: int | None = None, *, copy: bool = True,
                       ) -> tuple[StepResult, torch.Tensor]:
        self._settle()
        self._check_budget(1)
        grad = self._step(None, None)
        await asyncio.sleep(0)  # the engine's step awaits its computation
        return StepResult(float(self.local.norm()), batch_size or self.batch_size,
                          self.step_s), grad if copy else self._grad

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        size = batch_size or self.batch_size
        self._check_budget(count)
        for _ in range(count):
            self._settle()  # a model adopted during the last step's await, as the engine
            self.local = self.local - self.lr * self._step(correction, proximal)
            await asyncio.sleep(0)  # the engine's step awaits its computation
        return StepResult(float(self.local.norm()), count * size, count * self.step_s)

    async def snapshot(self) -> torch.Tensor:
        self._settle()
        return self.local.clone()

    async def delta_since(self, anchor: torch.Tensor, start: int = 0,
                          stop: int | None = None) -> torch.Tensor:
        self._settle()
        return (self.local - anchor)[start:stop]

    async def delta_and_snapshot(self, anchor: torch.Tensor) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        self._settle()
        return self.local - anchor, self.local.clone()

    async def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                         stop: int | None = None) -> None:
        self._settle()
        part = self.local[start:stop]
        part.mul_(1 - weight).add_(weight * target)

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        self._adopted = vector
        self.version = version

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        self._settle()
        return fn(*args)

    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        self._check_going()
        base = self.version if base_version is None else base_version
        push = Push(self.rank, base, kind, vector.clone(), steps, samples, dict(meta or {}))
        self._check_push(push)
        self.pushed.append(push)
        return wire_meta("on_push", await self.rule.on_push(push))

    def _check_push(self, push: Push) -> None:
        """Refuse `push` as the engine would, before the rule sees it."""
        if push.kind not in self.rule.push_kinds:
            accepted = ", ".join(sorted(self.rule.push_kinds))
            raise BadRequest(f"push kind {brief(push.kind)} not accepted (accepts: {accepted})")
        numel = self.rule.tensor_numel("push", push.meta)
        if numel is None:
            raise BadRequest("this push may carry no tensor")
        if push.vector.shape != (numel,):
            raise Unacceptable(f"wrong shape {list(push.vector.shape)}: expected [{numel}]")
        if min(push.steps, push.samples) < 0:
            raise BadRequest("field 'steps' and 'samples' must be >= 0")
        if push.samples > push.steps * self.max_batch:
            raise Unacceptable(f"{push.samples} samples in {push.steps} steps: more than "
                               f"max_batch = {self.max_batch} per step")
        if push.base_version > self.store.version:
            raise OutOfStep(f"base version {push.base_version} is ahead of the server's "
                            f"{self.store.version}")
        joined = self.store.joined_at.get(push.worker, 0)
        if push.base_version < joined:
            raise OutOfStep(f"update based on version {push.base_version}, before worker "
                            f"{push.worker} rejoined at version {joined}")
        if not all_finite(push.vector):
            raise Unacceptable("non-finite values (NaN or Inf) in the pushed tensor")

    async def pull(self, meta: dict[str, Any] | None = None, base_version: int | None = None
                   ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        self._check_going()
        base = self.version if base_version is None else base_version
        reply = await self.rule.on_pull(Pull(self.rank, base, dict(meta or {})))
        if reply.vector is None or reply.version is None:
            raise RuntimeError("the rule answered a pull without a model")
        return reply.vector.clone(), reply.version, wire_meta("on_pull", reply.meta)

    async def push_and_pull(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                             meta: dict[str, Any] | None = None,
                             ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        base = self.version
        pushed = await self.push(kind, vector, steps, samples, meta, base)
        pulled, version, pull_meta = await self.pull(meta, base)
        return pulled, version, {**pull_meta, "push": pushed}

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        return wire_meta("on_query", await self.rule.on_query(self.rank, meta))


def checked_store(store: FakeStore) -> Store:
    """`store` as the `Store` port (a type check: it implements the port)."""
    return store


def checked_context(ctx: FakeContext) -> Context:
    """`ctx` as the `Context` port (a type check: it implements the port)."""
    return ctx
