"""A test kit for protocol authors: a store and a context that stand in for the engine.

`FakeStore` implements the `Store` port in memory and changes membership as the engine
does (`join` adds a rank to ``live`` and calls the rule's `on_join`; `leave` removes it,
calls `on_leave` and wakes waiters). `FakeContext` implements the `Context` port over a
`FakeStore` and its rule: its pushes and pulls go straight to the rule, and its local
model is a flat vector that each local step moves by `step` (a function of the model).
Both are SDK-only, so a rule or a loop can be tested without the engine, a transport or
a model; `asyncsync.study.simulation.run_virtual` runs whole protocols in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from asyncsync.protocols.base import ServerRule
from asyncsync.protocols.messages import NotInRun, Pull, Push, Reply, RunStopped
from asyncsync.protocols.ports import Context, Contributions, LiveSet, StepResult, Store

T = TypeVar("T")


@dataclass(frozen=True)
class Commit:
    """One commit of a `FakeStore`: the version it made, and who contributed."""

    version: int
    contributions: Contributions


class FakeStore:
    """The `Store` port in memory: commits are kept in `commits`, time is `clock`.

    `apply_gradient` is plain SGD with rate `lr` on the leading `num_params` elements (the
    rest are buffers, which the gradient's slots replace).
    """

    def __init__(self, vector: torch.Tensor, workers: int, lr: float = 1.0,
                 num_params: int | None = None, live: Iterable[int] | None = None) -> None:
        self.w = vector
        self.numel = vector.numel()
        self.num_params = self.numel if num_params is None else num_params
        self.version = 0
        self.workers = workers
        self.lr = lr
        self.lock = asyncio.Lock()
        self.clock = 0.0
        self.stopping = False
        self.commits: list[Commit] = []
        self._live = LiveSet(range(workers) if live is None else live)
        self._changed = asyncio.Event()

    @property
    def live(self) -> Set[int]:
        return self._live

    @property
    def membership(self) -> int:
        return self._live.changes

    def now(self) -> float:
        return self.clock

    def current(self) -> Reply:
        return Reply(vector=self.w, version=self.version)

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def apply_gradient(self, gradient: torch.Tensor, contributions: Contributions) -> None:
        n = self.num_params
        new = gradient.clone()
        new[:n] = self.w[:n] - self.lr * gradient[:n]
        self.commit(new, contributions)

    def commit(self, vector: torch.Tensor, contributions: Contributions) -> None:
        self.w = vector
        self.version += 1
        self.commits.append(Commit(self.version, list(contributions)))
        self.notify()

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, ready: Callable[[], bool], worker: int) -> None:
        while not ready():
            if self.stopping:
                raise RunStopped
            if worker not in self._live:
                raise NotInRun(f"worker {worker} was dropped while its request waited")
            await self._changed.wait()

    async def join(self, rule: ServerRule[Any], worker: int) -> None:
        """`worker` (re)joins a running run, as the engine admits it."""
        self._live.add(worker)
        await rule.on_join(worker)
        self.notify()

    async def leave(self, rule: ServerRule[Any], worker: int) -> None:
        """`worker` leaves or is lost, as the engine drops it."""
        self._live.discard(worker)
        if not self.stopping:
            await rule.on_leave(worker)
        self.notify()

    def stop(self) -> None:
        """End the run: every waiter raises `RunStopped`."""
        self.stopping = True
        self.notify()


def _toward_zero(local: torch.Tensor) -> torch.Tensor:
    """The default loss's gradient: ``|w|^2 / 2`` has gradient w."""
    return local


@dataclass
class FakeContext:
    """The `Context` port over a `FakeStore` and its rule, for testing a `WorkerLoop`.

    The local model is `local` (the store's model at first). A local step subtracts
    ``lr * grad_fn(local)`` and takes `step_s` seconds of the store's clock. A computation
    whose steps would pass `max_steps` raises `RunStopped` before any of them, as the
    engine's context does. `shard_size` is the size the context reports for the worker's
    data shard (None: unknown). Pushes go to the rule's `on_push` and are recorded in
    `pushed`; pulls and queries go to the rule.
    """

    store: FakeStore
    rule: ServerRule[Any]
    rank: int = 0
    max_steps: int = 100
    batch_size: int = 16
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

    def __post_init__(self) -> None:
        self.local = self.store.w.clone()
        self.workers = self.store.workers
        self.numel = self.store.numel

    def _check_budget(self, count: int) -> None:
        if self.done + count > self.max_steps:
            raise RunStopped

    def _step(self, correction: torch.Tensor | None,
              proximal: tuple[torch.Tensor, float] | None) -> torch.Tensor:
        self.done += 1
        self.store.clock += self.step_s
        grad = self.grad_fn(self.local).clone()
        if correction is not None:
            grad += correction
        if proximal is not None:
            grad += proximal[1] * (self.local - proximal[0])
        return grad

    async def gradient(self, batch_size: int | None = None, *, copy: bool = True,
                       ) -> tuple[StepResult, torch.Tensor]:
        self._check_budget(1)
        grad = self._step(None, None)  # always a new tensor
        return StepResult(float(self.local.norm()), batch_size or self.batch_size,
                          self.step_s), grad

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        size = batch_size or self.batch_size
        self._check_budget(count)
        for _ in range(count):
            self.local = self.local - self.lr * self._step(correction, proximal)
        return StepResult(float(self.local.norm()), count * size, count * self.step_s)

    async def snapshot(self) -> torch.Tensor:
        return self.local.clone()

    async def delta_since(self, anchor: torch.Tensor, start: int = 0,
                          stop: int | None = None) -> torch.Tensor:
        return (self.local - anchor)[start:stop]

    async def delta_and_snapshot(self, anchor: torch.Tensor) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        return self.local - anchor, self.local.clone()

    async def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                         stop: int | None = None) -> None:
        part = self.local[start:stop]
        part.mul_(1 - weight).add_(weight * target)

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        self.local = vector.clone()
        self.version = version

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        base = self.version if base_version is None else base_version
        push = Push(self.rank, base, kind, vector.clone(), steps, samples, dict(meta or {}))
        self.pushed.append(push)
        return await self.rule.on_push(push)

    async def pull(self, meta: dict[str, Any] | None = None, base_version: int | None = None
                   ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        base = self.version if base_version is None else base_version
        reply = await self.rule.on_pull(Pull(self.rank, base, dict(meta or {})))
        if reply.vector is None or reply.version is None:
            raise RuntimeError("the rule answered a pull without a model")
        return reply.vector.clone(), reply.version, reply.meta

    async def push_and_pull(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                             meta: dict[str, Any] | None = None,
                             ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        base = self.version
        pushed = await self.push(kind, vector, steps, samples, meta, base)
        pulled, version, pull_meta = await self.pull(meta, base)
        return pulled, version, {**pull_meta, "push": pushed}

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        return await self.rule.on_query(self.rank, meta)


def checked_store(store: FakeStore) -> Store:
    """`store` as the `Store` port (a type check: it implements the port)."""
    return store


def checked_context(ctx: FakeContext) -> Context:
    """`ctx` as the `Context` port (a type check: it implements the port)."""
    return ctx
