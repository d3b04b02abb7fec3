"""The SDK's ports: what a `ServerRule` may touch of the store, what a `WorkerLoop` may do.

Both are `typing.Protocol`s implemented by the engine; a protocol module sees nothing else
of it. Time comes from ``store.now()`` (the run's one clock, virtual or real); waiting is
done with ``store.wait_for`` or asyncio primitives, never with a sleep on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import torch

from asyncsync.protocols.messages import Reply

T = TypeVar("T")
Contributions = list[tuple[int, int]]
"""``(worker, base_version)`` of each update that makes a commit."""


class LiveSet(set[int]):
    """The ranks in a run, counting its own changes (`changes`, a store's `membership`):
    every method that may change a set bumps it, whether or not the contents moved."""

    def __init__(self, ranks: Iterable[int] = ()) -> None:
        super().__init__(ranks)
        self.changes = 0

    def add(self, rank: int) -> None:
        super().add(rank)
        self.changes += 1

    def discard(self, rank: object) -> None:
        super().discard(rank)
        self.changes += 1

    def remove(self, rank: int) -> None:
        super().remove(rank)
        self.changes += 1

    def pop(self) -> int:
        self.changes += 1
        return super().pop()

    def clear(self) -> None:
        super().clear()
        self.changes += 1

    def update(self, *others: Iterable[int]) -> None:
        super().update(*others)
        self.changes += 1

    def difference_update(self, *others: Iterable[Any]) -> None:
        super().difference_update(*others)
        self.changes += 1

    def intersection_update(self, *others: Iterable[Any]) -> None:
        super().intersection_update(*others)
        self.changes += 1

    def symmetric_difference_update(self, other: Iterable[int]) -> None:
        super().symmetric_difference_update(other)
        self.changes += 1

    def __ior__(self, other: Set[int]) -> Self:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __iand__(self, other: Set[object]) -> Self:
        self.intersection_update(other)
        return self

    def __isub__(self, other: Set[object]) -> Self:
        self.difference_update(other)
        return self

    def __ixor__(self, other: Set[int]) -> Self:  # type: ignore[override,misc]
        self.symmetric_difference_update(other)
        return self


@dataclass(frozen=True)
class StepResult:
    """What one local computation produced: last loss, samples used, seconds charged."""

    loss: float
    samples: int
    compute_s: float


class Store(Protocol):
    """The global model as a rule may see and change it.

    Attributes:
        w: the current global vector (parameters first, then float buffers); read only.
        numel: its length; num_params: how many leading elements are parameters (the rest
            are buffers such as BatchNorm statistics, which are averaged, never stepped).
        version: the number of commits so far (after a resume: since the first run).
        workers: the run's configured size; live: the ranks in the run now.
        lock: held by a rule while it reads and commits, so updates do not interleave.
    """

    w: torch.Tensor
    numel: int
    num_params: int
    version: int
    workers: int
    lock: asyncio.Lock

    @property
    def live(self) -> Set[int]: ...

    @property
    def membership(self) -> int:
        """A count that changes whenever `live` does: what a rule derives from `live`
        (say, the slowest live clock) stays valid while this count stays the same."""
        ...

    def now(self) -> float:
        """Seconds on the run's clock (virtual in virtual mode)."""
        ...

    def current(self) -> Reply:
        """A reply carrying the current model and version."""
        ...

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Run O(model) vector math through the server's compute seam."""
        ...

    async def apply_gradient(self, gradient: torch.Tensor, contributions: Contributions) -> None:
        """Commit ``w - server_optimizer.update(w, g)`` (parameters; buffer slots of
        `gradient` carry buffer values, which replace the global ones)."""
        ...

    def commit(self, vector: torch.Tensor, contributions: Contributions) -> None:
        """Install `vector` as the next version and wake every waiter."""
        ...

    def notify(self) -> None:
        """Have the requests held in `wait_for` check their conditions again, once the code
        running now is done: call it after every change that can make a condition true
        (the conditions are checked only then, and the store's own changes call it)."""
        ...

    async def wait_for(self, ready: Callable[[], bool], worker: int) -> None:
        """Block `worker`'s request until `ready()`; raises `RunStopped` when the run ends and
        `NotInRun` when the worker is dropped meanwhile."""
        ...


class Context(Protocol):
    """What a worker loop may do: compute locally, and talk to the server.

    Attributes:
        rank: this worker's rank; workers: the run's size; numel: the model's length.
        version: the global version the local model was last adopted from.
        batch_size: the default local batch size; lr: the learning rate of local steps.
        shard_size: the samples in this worker's data shard, which its batches go through
            in reshuffled epochs (None: its batch source does not tell).

    Vectors are CPU tensors; those a verb returns belong to the loop. Every verb that
    computes goes through the worker's compute seam (its time is charged as computation);
    every request may raise `RunStopped`.
    """

    rank: int
    workers: int
    numel: int
    version: int
    batch_size: int
    lr: float
    shard_size: int | None

    async def gradient(self, batch_size: int | None = None, *, copy: bool = True,
                       ) -> tuple[StepResult, torch.Tensor]:
        """One batch's gradient as a vector (buffer slots carry the buffers' values).

        With ``copy=False`` the vector may be the trainer's own gradient storage (on a CPU
        device: no copy, ~0.1 ms a step for a 0.5 MB model): valid only until the next
        computation, so push it and await that request before computing again (bsp, asp
        and lbbsp do); a loop that computes while the push is in flight keeps the copy.
        """
        ...

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        """`count` local SGD steps; with ``proximal=(center, rho)`` on the objective
        ``f(x) + rho/2 ||x - center||^2``; with a `correction` (a full-length vector), each
        step's gradient is ``g + correction`` (parameters only; SCAFFOLD's ``c - c_i``).
        Raises `RunStopped`, before any step, if `count` steps would pass the worker's
        step budget: a call runs whole or not at all."""
        ...

    async def snapshot(self) -> torch.Tensor:
        """A copy of the local model."""
        ...

    async def delta_since(self, anchor: torch.Tensor, start: int = 0,
                          stop: int | None = None) -> torch.Tensor:
        """``w_i - anchor`` on ``[start, stop)`` (`anchor` is a full-length vector)."""
        ...

    async def delta_and_snapshot(self, anchor: torch.Tensor) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        """``(w_i - anchor, copy of w_i)``: the progress since `anchor`, and the next anchor."""
        ...

    async def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                         stop: int | None = None) -> None:
        """``w_i <- (1 - weight) w_i + weight target`` on ``[start, stop)``; `target` holds
        just that slice."""
        ...

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        """Make `vector` (global version `version`) the local model. The copy may be made
        with the next computation (every verb here and `compute` see it done): write into
        `vector` afterwards only through `compute`."""
        ...

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Vector math on tensors the loop holds, off the event loop (not the local model:
        use the verbs above for that)."""
        ...

    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        """Send a gradient, delta or model (`steps` and `samples` it took); the reply's meta."""
        ...

    async def pull(self, meta: dict[str, Any] | None = None, base_version: int | None = None
                   ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        """Fetch the global model (or the fragment `meta` names): ``(vector, version, meta)``."""
        ...

    async def push_and_pull(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                            meta: dict[str, Any] | None = None,
                            ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        """`push`, then `pull` with the same `meta` and base version, in one request (one
        round trip fewer than `push` and `pull`): returns when the pull would, with the
        pull's ``(vector, version, meta)``; the push's reply meta is under
        ``meta["push"]``."""
        ...

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A protocol-specific control message; the reply's meta."""
        ...
