"""LB-BSP: load-balanced bulk synchronous parallel (semi-dynamic batch sizing).

BSP with a barrier every iteration, but worker i computes its gradient on its own batch of
x_i samples, re-sized at each barrier so that all workers finish together while the global
batch ``X = sum_i x_i`` stays fixed. Server: when all N gradients of the version are in,
``w <- opt_step(w, sum_i (x_i / X) g_i)`` (with mean-reduced losses this is exactly the
gradient of the union of the N batches), version += 1; then it assigns the next sizes,
which the pull replies carry as ``meta["batch_size"]``. Workers push their measured compute
time of the batch in ``meta["compute_s"]`` and must use the size they were assigned.

Batch sizing, per barrier:

1. Speed prediction **(choice)**: an exponentially weighted moving average of each
   worker's measured speed ``x_i / compute_s``, ``v_i <- beta v_i + (1 - beta) measured``
   (``smoothing`` = beta; the paper's NARX predictor for CPU clusters is not offered).
2. Target: ``X v_i / sum_j v_j`` rounded to integers that sum to X (largest remainder)
   within ``[min_batch, max_batch]``.
3. Damping: each worker moves ``gain_i * (target_i - x_i)`` towards its target; when the
   direction of that adjustment reverses, ``gain_i`` is halved (the paper's GPU variant;
   floor 1/64), and while it persists the gain grows back by 1.5x up to 1 (**(choice)**,
   so that a later change of speed is still tracked). The moved sizes are re-rounded to sum to X.

X is ``global_batch``, or when that is 0 the sum of the workers' first batches (each its
default batch size, clamped to the bounds).

Reference: C. Chen, Q. Weng, W. Wang, B. Li, B. Li, "Semi-Dynamic Load Balancing:
Efficient Distributed Learning in Non-Dedicated Environments", ACM SoCC 2020.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import Protocol, Pull, Push, Reply, ServerRule, WorkerLoop, register
from asyncsync.schema import check_fields, option
from asyncsync.wire import WireError

if TYPE_CHECKING:
    from asyncsync.server import ParameterStore
    from asyncsync.worker import WorkerContext

GAIN_GROWTH = 1.5
MIN_GAIN = 1.0 / 64


@dataclass(frozen=True)
class LbbspParams:
    """Parameters of LB-BSP."""

    global_batch: int = option(0, lambda v: v >= 0, "must be >= 0",
                               "X: samples per iteration over all workers (0: N x batch_size)")
    min_batch: int = option(1, lambda v: v >= 1, "must be >= 1", "smallest batch of a worker")
    max_batch: int = option(0, lambda v: v >= 0, "must be >= 0",
                            "largest batch of a worker (0: no bound)")
    smoothing: float = option(0.5, lambda v: 0 <= v < 1, "must be in [0, 1)",
                              "beta: weight of the past in the speed EWMA")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_batch and self.max_batch < self.min_batch:
            raise ValueError(f"max_batch: must be >= min_batch ({self.min_batch}) or 0, "
                             f"got {self.max_batch}")

    def bounds(self, total: int) -> tuple[int, int]:
        """The batch bounds of one worker when the global batch is `total`."""
        return self.min_batch, self.max_batch or total

    def first_batch(self, workers: int, rank: int, default: int) -> int:
        """The batch a worker uses before any assignment."""
        if self.global_batch:
            low, high = self.bounds(self.global_batch)
            return apportion(self.global_batch, [1.0] * workers, low, high)[rank]
        size = max(default, self.min_batch)
        return min(size, self.max_batch) if self.max_batch else size


def apportion(total: int, weights: Sequence[float], low: int, high: int) -> list[int]:
    """Split `total` into integers in ``[low, high]`` proportional to `weights`.

    Largest remainder rounding, as proportional as the bounds allow; needs
    ``len(weights) * low <= total <= len(weights) * high``.
    """
    n = len(weights)
    weight_sum = sum(weights)
    ideal = [total * w / weight_sum if weight_sum > 0 else total / n for w in weights]
    sizes = [min(max(math.floor(x), low), high) for x in ideal]
    while (short := total - sum(sizes)) != 0:
        if short > 0:
            i = max((i for i in range(n) if sizes[i] < high), key=lambda i: ideal[i] - sizes[i])
            sizes[i] += 1
        else:
            i = min((i for i in range(n) if sizes[i] > low), key=lambda i: ideal[i] - sizes[i])
            sizes[i] -= 1
    return sizes


class LbbspServer(ServerRule):
    """Per-iteration barrier; sample-weighted gradient step; batch re-sizing at the barrier."""

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: LbbspParams, store: ParameterStore) -> None:
        super().__init__(params, store)
        n = store.workers
        total = params.global_batch
        self.total = total or None
        self.batches: list[int] | None = None
        if total:
            low, high = params.bounds(total)
            if not n * low <= total <= n * high:
                raise ValueError(f"global_batch: {total} samples cannot be split among {n} "
                                 f"workers with batches in [{low}, {high}]")
            self.batches = apportion(total, [1.0] * n, low, high)
        self.speeds: list[float] = [0.0] * n
        self.gains = [1.0] * n
        self._directions = [0] * n
        self._sum: torch.Tensor | None = None
        self._pushed: list[tuple[int, int]] = []
        self._samples: dict[int, int] = {}
        self._seconds: dict[int, float] = {}

    def _check(self, push: Push) -> float:
        """Validate a push against the barrier and the assignment; returns its compute time."""
        version = self.store.version
        if push.base_version != version:
            raise WireError(409, f"gradient of version {push.base_version}, "
                                 f"but the barrier is at version {version}")
        if push.worker in self._samples:
            raise WireError(409, f"worker {push.worker} already pushed for version {version}")
        seconds = push.meta.get("compute_s")
        if (not isinstance(seconds, int | float) or isinstance(seconds, bool)
                or not math.isfinite(seconds) or seconds <= 0):
            raise WireError(400, "lbbsp needs meta 'compute_s': the batch's compute time "
                                 "in seconds, a finite number > 0")
        if self.batches is not None:
            assigned = self.batches[push.worker]
            if push.samples != assigned:
                raise WireError(409, f"worker {push.worker} pushed a batch of {push.samples} "
                                     f"samples but was assigned {assigned}")
        else:
            low, high = self.params.min_batch, self.params.max_batch or push.samples
            if not low <= push.samples <= high:
                raise WireError(409, f"first batch of {push.samples} samples is outside "
                                     f"[{low}, {high}]")
        return float(seconds)

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            seconds = self._check(push)
            total, samples = self._sum, float(push.samples)

            def accumulate() -> torch.Tensor:
                if total is None:
                    return push.vector * samples
                return total.add_(push.vector, alpha=samples)

            self._sum = await self.store.compute(accumulate)
            self._pushed.append((push.worker, push.base_version))
            self._samples[push.worker] = push.samples
            self._seconds[push.worker] = seconds
            if len(self._pushed) == self.store.workers:
                await self._step()
        return {}

    async def _step(self) -> None:
        """Apply the sample-weighted mean gradient, then assign the next batch sizes."""
        n = self.store.workers
        weighted, pushed = self._sum, self._pushed
        samples = [self._samples[i] for i in range(n)]
        seconds = [self._seconds[i] for i in range(n)]
        self._sum, self._pushed, self._samples, self._seconds = None, [], {}, {}
        assert weighted is not None
        total = self.total = self.total or sum(samples)
        mean = await self.store.compute(torch.div, weighted, total)
        self._resize(samples, seconds)
        await self.store.apply_gradient(mean, pushed)

    def _resize(self, samples: list[int], seconds: list[float]) -> None:
        """Update the speed estimates and move each batch towards its balanced size."""
        assert self.total is not None
        beta = self.params.smoothing
        for i, (x, t) in enumerate(zip(samples, seconds, strict=True)):
            measured = x / t
            self.speeds[i] = measured if self.speeds[i] == 0 else (
                beta * self.speeds[i] + (1 - beta) * measured)
        low, high = self.params.bounds(self.total)
        targets = apportion(self.total, self.speeds, low, high)
        moved = []
        for i, (x, target) in enumerate(zip(samples, targets, strict=True)):
            direction = (target > x) - (target < x)
            if direction and direction == -self._directions[i]:
                self.gains[i] = max(self.gains[i] / 2, MIN_GAIN)
            elif direction and direction == self._directions[i]:
                self.gains[i] = min(self.gains[i] * GAIN_GROWTH, 1.0)
            if direction:
                self._directions[i] = direction
            moved.append(x + self.gains[i] * (target - x))
        self.batches = apportion(self.total, moved, low, high)

    async def on_pull(self, pull: Pull) -> Reply:
        await self.store.wait_for(lambda: self.store.version > pull.base_version, pull.worker)
        reply = self.store.current()
        assert self.batches is not None
        reply.meta["batch_size"] = self.batches[pull.worker]
        return reply


class LbbspWorker(WorkerLoop):
    """Gradient on the assigned batch size, push it with its compute time, pull the next."""

    async def run(self, ctx: WorkerContext) -> None:
        batch = self.params.first_batch(ctx.workers, ctx.rank, ctx.batch_size)
        while True:
            result, grad = await ctx.gradient(batch_size=batch)
            await ctx.push("gradient", grad, steps=1, samples=result.samples,
                           meta={"compute_s": result.compute_s})
            vector, version, meta = await ctx.pull()
            await ctx.adopt(vector, version)
            batch = int(meta["batch_size"])


LBBSP = register(Protocol("lbbsp", "load-balanced BSP: per-worker batch sizes re-sized at "
                                   "each barrier so that workers finish together",
                          LbbspParams, LbbspServer, LbbspWorker))
