"""LB-BSP: load-balanced bulk synchronous parallel (semi-dynamic batch sizing).

BSP with a barrier every iteration, but worker i computes its gradient on its own batch of
x_i samples, re-sized at each barrier so that all workers finish together while the global
batch ``X = sum_i x_i`` stays fixed. Server: when the gradients of every live worker are
in, ``w <- opt_step(w, sum_i (x_i / X) g_i)`` with X the round's samples (with mean-reduced
losses this is exactly the gradient of the union of the batches), version += 1; then it
assigns the next sizes, which the pull replies carry as ``meta["batch_size"]``. A worker
starting its loop asks for its size with a query (none before the first assignment, when
``global_batch`` is 0: it then uses its default batch size). Workers push their measured
compute time of the batch in ``meta["compute_s"]`` and the samples the batch really held;
a batch may be smaller than assigned (a source at the end of its data), never larger, and
counts by its real samples. The protocol resizes batches, so a worker needs a callable
batch source (an iterable's fixed batches cannot follow the assignment), and the run must
accept steps of up to `LbbspParams.largest_batch` samples (the engine's ``max_batch``).

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
default batch size, clamped to the bounds). It is split among the live workers (within the
bounds: fewer workers may not be able to hold all of X).

Membership: a lost worker's gradient of the open round counts if it arrived, else the step
is taken with the others' (their samples make that round's global batch); the next assignment
splits X among the live workers. A rejoined worker is measured afresh: for the open round
it gets an equal share of X, and the round waits for its gradient.

Reference: C. Chen, Q. Weng, W. Wang, B. Li, B. Li, "Semi-Dynamic Load Balancing:
Efficient Distributed Learning in Non-Dedicated Environments", ACM SoCC 2020.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncsync.protocols.base import (
    BadRequest,
    OutOfStep,
    Protocol,
    Pull,
    Push,
    Reply,
    WorkerLoop,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.bsp import BspServer
from asyncsync.protocols.ports import Context, Store

GAIN_GROWTH = 1.5
MIN_GAIN = 1.0 / 64
MIN_COMPUTE_S, MAX_COMPUTE_S = 1e-9, 1e9
"""The compute times a push may report: outside them a speed (samples / seconds) could
overflow to inf or vanish, and the batch sizes derived from the speeds would not exist."""


@dataclass(frozen=True)
class LbbspParams:
    """Parameters of LB-BSP."""

    NOT_OFFERED = no_round_policies(
        "lbbsp", "its rounds wait for every worker: it balances batch sizes so that none straggles")

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

    def check_workers(self, workers: int) -> None:
        """Refuse a `global_batch` that `workers` workers cannot split within the bounds."""
        total = self.global_batch
        if total:
            low, high = self.bounds(total)
            if not workers * low <= total <= workers * high:
                raise ValueError(f"global_batch: {total} samples cannot be split among "
                                 f"{workers} workers with batches in [{low}, {high}]")

    def bounds(self, total: int) -> tuple[int, int]:
        """The batch bounds of one worker when the global batch is `total`."""
        return self.min_batch, self.max_batch or total

    def largest_batch(self, workers: int, default: int) -> int:
        """The largest batch the server may assign one of `workers` workers whose default
        batch size is `default`: X (``global_batch``, else the workers' first batches),
        capped by ``max_batch``. A run must accept steps this large."""
        total = self.global_batch or workers * self.first_batch(default)
        return min(total, self.max_batch) if self.max_batch else total

    def first_batch(self, default: int) -> int:
        """The batch a worker uses before any assignment: `default`, within the bounds."""
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


class LbbspServer(BspServer):
    """Per-iteration barrier over the live workers; sample-weighted gradient step; batch
    re-sizing at the barrier (see the module's notes on lost and rejoining workers).

    Attributes:
        batches: each worker's assigned batch size (empty before the first assignment
            when ``global_batch`` is 0).
        speeds: each worker's estimated speed in samples/s (0: not measured yet).
        gains: each worker's damping gain.
    """

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: LbbspParams, store: Store) -> None:
        super().__init__(params, store)
        n = store.workers
        total = params.global_batch
        self.total = total or None
        self.batches: dict[int, int] = {}
        params.check_workers(n)
        if total:
            low, high = params.bounds(total)
            self.batches = dict(enumerate(apportion(total, [1.0] * n, low, high)))
        self.speeds: list[float] = [0.0] * n
        self.gains = [1.0] * n
        self._directions = [0] * n

    def take(self, push: Push) -> None:
        """Check the push's compute time and batch size against the assignment."""
        seconds = push.meta.get("compute_s")
        if (not isinstance(seconds, int | float) or isinstance(seconds, bool)
                or not MIN_COMPUTE_S <= seconds <= MAX_COMPUTE_S):
            raise BadRequest(f"lbbsp needs meta 'compute_s': the batch's compute time in "
                             f"seconds, from {MIN_COMPUTE_S:g} to {MAX_COMPUTE_S:g}")
        if push.samples < 1:
            raise BadRequest("lbbsp weights gradients by samples: 'samples' must be >= 1")
        assigned = self.batches.get(push.worker)
        high = assigned if assigned is not None else (self.params.max_batch or push.samples)
        if push.samples > high:
            raise OutOfStep(f"worker {push.worker} pushed a batch of {push.samples} samples, "
                            f"more than the {high} it may use")

    def weight(self, push: Push) -> float:
        """A gradient counts by the samples its batch really held."""
        return float(push.samples)

    def joined(self, worker: int) -> None:
        self.speeds[worker], self.gains[worker], self._directions[worker] = 0.0, 1.0, 0
        if self.total is not None:
            low, high = self.params.bounds(self.total)
            self.batches[worker] = min(max(self.total // len(self.store.live), low), high)

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        """Apply the sample-weighted mean gradient, then assign the next batch sizes."""
        await super().close_round(fragment, pushes)
        samples = {worker: push.samples for worker, push in pushes.items()}
        self.total = self.total or sum(samples.values())
        self._resize(samples, {worker: float(push.meta["compute_s"])
                               for worker, push in pushes.items()})

    def _resize(self, samples: dict[int, int], seconds: dict[int, float]) -> None:
        """Update the measured workers' speed estimates and move each live worker's batch
        towards its balanced size."""
        assert self.total is not None
        beta = self.params.smoothing
        for i, x in samples.items():
            measured = x / seconds[i]
            self.speeds[i] = measured if self.speeds[i] == 0 else (
                beta * self.speeds[i] + (1 - beta) * measured)
        members = sorted(self.store.live)
        if not members:
            return
        known = [self.speeds[i] for i in members if self.speeds[i] > 0]
        unknown = sum(known) / len(known) if known else 1.0  # an equal share
        low, high = self.params.bounds(self.total)
        total = min(max(self.total, len(members) * low), len(members) * high)
        targets = apportion(total, [self.speeds[i] or unknown for i in members], low, high)
        moved = []
        for i, target in zip(members, targets, strict=True):
            x = samples.get(i, target)
            direction = (target > x) - (target < x)
            if direction and direction == -self._directions[i]:
                self.gains[i] = max(self.gains[i] / 2, MIN_GAIN)
            elif direction and direction == self._directions[i]:
                self.gains[i] = min(self.gains[i] * GAIN_GROWTH, 1.0)
            if direction:
                self._directions[i] = direction
            moved.append(x + self.gains[i] * (target - x))
        self.batches.update(zip(members, apportion(total, moved, low, high), strict=True))

    async def on_pull(self, pull: Pull) -> Reply:
        reply = await super().on_pull(pull)
        if pull.worker in self.batches:
            reply.meta["batch_size"] = self.batches[pull.worker]
        return reply

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The worker's assigned batch size, if it has one."""
        size = self.batches.get(worker)
        return {} if size is None else {"batch_size": size}


class LbbspWorker(WorkerLoop[LbbspParams]):
    """Gradient on the assigned batch size, push it with its compute time, pull the next."""

    async def run(self, ctx: Context) -> None:
        assigned = (await ctx.query({})).get("batch_size")
        batch = self.params.first_batch(ctx.batch_size) if assigned is None else int(assigned)
        while True:
            result, grad = await ctx.gradient(batch_size=batch, copy=False)
            vector, version, meta = await ctx.push_and_pull(
                "gradient", grad, steps=1, samples=result.samples,
                meta={"compute_s": result.compute_s})
            await ctx.adopt(vector, version)
            batch = int(meta.get("batch_size", batch))


LBBSP = register(Protocol("lbbsp", "load-balanced BSP: per-worker batch sizes re-sized at "
                                   "each barrier so that workers finish together",
                          LbbspParams, LbbspServer, LbbspWorker, resizes_batches=True))
