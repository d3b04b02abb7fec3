"""Defining properties of bsp and asp, run in process with scripted slowdowns."""

from __future__ import annotations

import asyncio

from asyncsync.hetero.compute import StepDelay
from asyncsync.server import ServerCore, build_core
from asyncsync.transport.local import LocalTransport
from asyncsync.worker import Worker
from tests.helpers import batches_of, tiny_data, tiny_model


async def run_workers(protocol: str, delays: list[float], max_steps: int
                      ) -> tuple[ServerCore, list[dict[str, float]]]:
    """Run one worker per step delay (seconds) in process until one did `max_steps` steps.

    The server stops once the first worker finishes, so no worker blocks on a barrier
    that a finished peer will never reach.
    """
    x, y = tiny_data()
    core = build_core(tiny_model(), protocol, len(delays), lr=0.1)
    workers = [
        Worker(rank, LocalTransport(core), tiny_model(), batches_of(x, y, rank), protocol,
               batch_size=16, slowdown=StepDelay(delay), max_steps=max_steps)
        for rank, delay in enumerate(delays)
    ]

    async def run(worker: Worker) -> dict[str, float]:
        final = await worker.run()
        await core.stop()
        return final

    finals = await asyncio.gather(*(run(w) for w in workers))
    await core.close()
    return core, finals


async def test_bsp_every_version_has_exactly_n_gradients_from_that_version() -> None:
    core, finals = await run_workers("bsp", [0.0, 0.005, 0.02], max_steps=20)
    commits = core.store.commits
    assert len(commits) >= 19
    for commit in commits:
        ranks = sorted(worker for worker, _ in commit.contributions)
        assert ranks == [0, 1, 2], commit
        assert all(base == commit.version - 1 for _, base in commit.contributions), commit
    assert core.store.staleness.maximum == 0
    # the barrier held the fast workers: they waited while the slow one computed
    assert core.store.blocked_s[0] > core.store.blocked_s.get(2, 0.0)
    assert {f["steps"] for f in finals} <= {20, 21}


async def test_asp_never_waits_and_records_staleness() -> None:
    core, finals = await run_workers("asp", [0.0, 0.03], max_steps=60)
    # no request was ever held for another worker
    assert sum(core.store.blocked_s.values()) == 0.0
    fast, slow = finals
    assert fast["steps"] >= 3 * slow["steps"]
    # every commit applied exactly one gradient, and the slow worker's were stale
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert core.store.staleness.count == len(core.store.commits)
    assert core.store.staleness.maximum >= 2
