"""DS-Sync: divide-and-shuffle synchronization, parameter averaging within small groups.

Every iteration each worker averages its parameters (and BatchNorm statistics: the whole
flat vector) with the members of its group only, then takes one local step; its optimizer
state stays local. Groups of size k (default 2) partition the workers and every iteration
uses a new partition, so information still spreads to every worker within a few
iterations, while no step ever waits for all N workers.

Worker: push its model for iteration t, pull its group's mean, adopt it, one local step.
Server: only the rendezvous. It keeps each worker's iteration count, waits for the k
members of the worker's group of that iteration and answers each of them with their mean.
Every completed group is a version, whose vector is the mean of the live workers' latest
models (the one that is evaluated); the commit records the group's members as its
contributions. A worker starting its loop asks the server for its iteration (a query).

Membership: a group waits only for its members that are live and in the run at that
iteration. When a worker is lost, its pushes still waiting for a group are withdrawn and
every group that now has all its expected members completes with them (a group of one
keeps its model); once the run is stopping, leaving workers complete no group. A rejoined
worker starts at the first iteration nobody has pushed yet, from the current global model;
groups of earlier iterations do not wait for it.

**(choice)** Partitions: for N = 4 and k = 2, the official code's alternation {0,1}{2,3} /
{0,3}{1,2}; otherwise consecutive chunks of a random permutation of the ranks seeded by
(seed, iteration), the same on every node. When k does not divide N the last group is
smaller (a group of one just keeps its model); k larger than N means one group of all.

Reference: W. Wang, C. Zhang, L. Yang, K. Chen, K. Tan, "Addressing Network Bottlenecks
with Divide-and-Shuffle Synchronization for Distributed DNN Training", IEEE INFOCOM 2022.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import (
    HISTORY,
    OutOfStep,
    Protocol,
    Pull,
    Push,
    Reply,
    ServerRule,
    WorkerLoop,
    all_finite,
    brief,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import average

Group = tuple[int, ...]


@dataclass(frozen=True)
class DsSyncParams:
    """Parameters of DS-Sync."""

    NOT_OFFERED = no_round_policies(
        "dssync", "it has no round barrier: each worker averages with a small group of its own")

    group_size: int = option(2, lambda v: v >= 2, "must be >= 2",
                             "k: workers per group (the last group may be smaller)")
    seed: int = option(0, lambda v: v >= 0, "must be >= 0",
                       "seed of the per-iteration random partitions")

    def __post_init__(self) -> None:
        check_fields(self)


def partition(iteration: int, workers: int, size: int, seed: int) -> list[Group]:
    """The groups of `iteration`: disjoint, sorted, covering ``range(workers)``."""
    if workers == 4 and size == 2:
        return [(0, 1), (2, 3)] if iteration % 2 == 0 else [(0, 3), (1, 2)]
    order = list(range(workers))
    random.Random(f"dssync:{seed}:{iteration}").shuffle(order)
    return [tuple(sorted(order[i : i + size])) for i in range(0, workers, size)]


@dataclass(frozen=True)
class GroupAverage:
    """One completed group: its iteration, the members whose models were averaged, the
    version it made, and the live workers that had not yet pushed for that iteration when
    it completed."""

    iteration: int
    members: Group
    version: int
    behind: Group


class DsSyncServer(ServerRule):
    """The rendezvous of each iteration's groups; the global vector is the live workers'
    mean (see the module's notes on lost and rejoining workers).

    Attributes:
        averages: the most recent completed group averages (at most `HISTORY`), in order.
    """

    push_kinds = frozenset({"model"})

    def __init__(self, params: DsSyncParams, store: Store) -> None:
        super().__init__(params, store)
        self.averages: deque[GroupAverage] = deque(maxlen=HISTORY)
        self._pushed = [0] * store.workers  # the next iteration of each worker
        self._start = [0] * store.workers  # each worker's first iteration since it joined
        self._latest = [store.w] * store.workers
        self._averaged: frozenset[int] = frozenset()  # whose latest models ``w`` averages
        self._slots: dict[tuple[int, Group], dict[int, Push]] = {}
        self._results: dict[int, tuple[int, torch.Tensor, int, Group]] = {}

    def group_of(self, worker: int, iteration: int) -> Group:
        """The members of `worker`'s group at `iteration`."""
        size = min(self.params.group_size, self.store.workers)
        groups = partition(iteration, self.store.workers, size, self.params.seed)
        return next(group for group in groups if worker in group)

    def expected(self, iteration: int, group: Group) -> set[int]:
        """The members of `group` that its average at `iteration` waits for."""
        return {m for m in group if m in self.store.live and self._start[m] <= iteration}

    def _iteration(self, meta: dict[str, Any], expected: int) -> int:
        iteration = meta.get("iteration")
        if iteration != expected or isinstance(iteration, bool):
            raise OutOfStep(f"iteration {brief(iteration)} in meta, but the server expects "
                            f"{expected}")
        return expected

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The iteration the worker pushes next."""
        return {"iteration": self._pushed[worker]}

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            iteration = self._iteration(push.meta, self._pushed[push.worker])
            group = self.group_of(push.worker, iteration)
            self._slots.setdefault((iteration, group), {})[push.worker] = push
            self._pushed[push.worker] += 1
            await self._settle(iteration, group)
        return {"iteration": iteration, "group": list(group)}

    async def _settle(self, iteration: int, group: Group) -> None:
        """Average the slot of `group` at `iteration` if every expected member is in."""
        slot = self._slots[iteration, group]
        if not slot:
            del self._slots[iteration, group]
        elif slot.keys() >= self.expected(iteration, group):
            await self._average(iteration, slot)
            del self._slots[iteration, group]

    async def _average(self, iteration: int, pushes: dict[int, Push]) -> None:
        """Answer the members with their mean; fold it into the mean of the latest models.

        The consensus is committed before any of the rule's state changes, so a commit the
        store refused would leave the group state as it was. The consensus is the mean of
        finite models: when the incremental update overflows on the way, it is recomputed
        as that mean, so finite pushes always make a finite version.
        """
        members = tuple(sorted(pushes))
        vectors = [pushes[m].vector for m in members]
        present = frozenset(self.store.live) or frozenset(members)
        incremental = present == self._averaged
        latest, w = list(self._latest), self.store.w

        def mean_and_consensus() -> tuple[torch.Tensor, torch.Tensor]:
            mean = average(vectors)
            if incremental:
                change = torch.zeros_like(w)
                for m in members:
                    if m in present:
                        change.add_(mean).sub_(latest[m])
                consensus = w.add(change, alpha=1.0 / len(present))
                if all_finite(consensus):
                    return mean, consensus
            for m in members:
                latest[m] = mean
            return mean, average([latest[j] for j in sorted(present)])

        mean, consensus = await self.store.compute(mean_and_consensus)
        behind = tuple(j for j in sorted(self.store.live) if self._pushed[j] <= iteration)
        self.store.commit(consensus, [(m, pushes[m].base_version) for m in members])
        version = self.store.version
        for m in members:
            self._latest[m] = mean
            self._results[m] = (iteration, mean, version, members)
        self._averaged = present
        self.averages.append(GroupAverage(iteration, members, version, behind))

    async def on_pull(self, pull: Pull) -> Reply:
        """Wait for the worker's group of its last pushed iteration; answer with its mean."""
        if self._pushed[pull.worker] == self._start[pull.worker]:
            raise OutOfStep(f"worker {pull.worker} pulls before its first push")
        iteration = self._iteration(pull.meta, self._pushed[pull.worker] - 1)

        def ready() -> bool:
            result = self._results.get(pull.worker)
            return result is not None and result[0] == iteration

        await self.store.wait_for(ready, pull.worker)
        _, mean, version, members = self._results[pull.worker]
        return Reply(meta={"iteration": iteration, "group": list(members)},
                     vector=mean, version=version)

    async def on_leave(self, worker: int) -> None:
        async with self.store.lock:
            for iteration, group in list(self._slots):
                self._slots[iteration, group].pop(worker, None)
                await self._settle(iteration, group)

    async def on_join(self, worker: int) -> None:
        async with self.store.lock:
            self._start[worker] = self._pushed[worker] = max(self._pushed)
            self._latest[worker] = self.store.w
            self._averaged = frozenset()  # the next average recomputes the consensus


class DsSyncWorker(WorkerLoop):
    """Push the model, adopt the group's mean, one local step."""

    async def run(self, ctx: Context) -> None:
        iteration = int((await ctx.query({}))["iteration"])
        steps = samples = 0
        while True:
            model = await ctx.snapshot()
            meta = {"iteration": iteration}
            await ctx.push("model", model, steps=steps, samples=samples, meta=meta)
            mean, version, _ = await ctx.pull(meta=meta)
            await ctx.adopt(mean, version)
            steps, samples = 1, (await ctx.steps(1)).samples
            iteration += 1


DSSYNC = register(Protocol("dssync", "divide-and-shuffle: average with a new small group "
                                     "every iteration", DsSyncParams, DsSyncServer,
                           DsSyncWorker))
