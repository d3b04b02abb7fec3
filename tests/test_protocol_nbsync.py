"""NBSync: computation never waits for a slow link, and each delta holds one sync's steps."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
import torch

from asyncsync.clock import now
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import WorkerContext
from asyncsync.protocols.base import Context, Protocol
from asyncsync.protocols.nbsync import NbsyncParams, NbsyncServer, NbsyncWorker
from asyncsync.protocols.ports import StepResult
from asyncsync.study.simulation import run_virtual
from tests.helpers import (
    SLOW_LINK,
    SLOW_LINK_DELAYS,
    batches_of,
    run_http,
    run_local,
    tiny_data,
    tiny_model,
)


async def test_slow_link_compute_never_waits_and_deltas_hold_one_sync(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # per rank: each local step's change of the local model, in order
    increments: dict[int, list[torch.Tensor]] = defaultdict(list)
    pushes: dict[int, list[tuple[int, int, torch.Tensor]]] = defaultdict(list)
    pushed_at: dict[int, list[float]] = defaultdict(list)
    pulled_at: dict[int, list[float]] = defaultdict(list)
    steps_verb, push, pull = WorkerContext.steps, WorkerContext.push, WorkerContext.pull

    async def recording_steps(self: WorkerContext, count: int = 1, *args: Any,
                              **kw: Any) -> StepResult:
        assert count == 1  # nbsync steps one at a time, so each increment is one step
        before = await self.snapshot()
        result = await steps_verb(self, count, *args, **kw)
        increments[self.rank].append(await self.snapshot() - before)
        return result

    async def recording_push(self: WorkerContext, kind: str, vector: torch.Tensor,
                             steps: int, samples: int, **kw: Any) -> dict[str, Any]:
        # steps finished when this push left (the loop is computing the next one)
        pushes[self.rank].append((len(increments[self.rank]), steps, vector.clone()))
        pushed_at[self.rank].append(now())
        return await push(self, kind, vector, steps, samples, **kw)

    async def recording_pull(self: WorkerContext, *args: Any, **kw: Any
                             ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        reply = await pull(self, *args, **kw)
        pulled_at[self.rank].append(now())
        return reply

    monkeypatch.setattr(WorkerContext, "steps", recording_steps)
    monkeypatch.setattr(WorkerContext, "push", recording_push)
    monkeypatch.setattr(WorkerContext, "pull", recording_pull)
    delays = SLOW_LINK_DELAYS
    core, finals = await run_local("nbsync", delays, time_s=4.5, link=SLOW_LINK)

    proportions = [f["compute_s"] / f["wall_s"] for f in finals]
    assert min(proportions) > 0.9, proportions
    assert core.store.version >= 3
    for commit in core.store.commits:  # synchronous rounds: one delta per worker
        assert sorted(w for w, _ in commit.contributions) == [0, 1, 2]
    assert len(pushes) == 3
    for rank, sent in pushes.items():
        done = 0
        for finished, steps, delta in sent:
            # the delta is exactly the steps made since the previous push left, i.e. while
            # the previous synchronization was in flight (the first: the first step)
            assert steps == finished - done >= 1
            expected = torch.stack(increments[rank][done:finished]).sum(0)
            torch.testing.assert_close(delta, expected, rtol=1e-5, atol=1e-6)
            done = finished
        # each next push leaves at the first step boundary after the previous sync ended
        for synced, sent_at in zip(pulled_at[rank], pushed_at[rank][1:], strict=False):
            assert 0 <= sent_at - synced <= 1.5 * delays[rank] + 0.1
        # a sync outlasts several local steps, so the fast workers' deltas hold several
        if rank < 2:
            assert sum(s for _, s, _ in sent[1:]) >= 2.5 * (len(sent) - 1), (
                rank, [s for _, s, _ in sent])


async def test_stopping_with_a_sync_in_flight_leaks_no_task() -> None:
    # the harness fails a run that leaves a task pending on its loop (a leak; see
    # test_the_harness_reports_a_leaked_task)
    core, finals = await run_local("nbsync", [0.01, 0.05], max_steps=5, link=SLOW_LINK)
    # worker 0 hit its step budget while its first push was still on the wire (it left, so
    # worker 1's delta may have made a round alone)
    assert finals[0]["steps"] == 5
    assert all(worker != 0 for c in core.store.commits for worker, _ in c.contributions)


class LeakingWorker(NbsyncWorker):
    """NBSync that starts a background task and never cancels it."""

    async def run(self, ctx: Context) -> None:
        self.forgotten = asyncio.create_task(asyncio.sleep(1e9), name="forgotten")
        await super().run(ctx)


async def test_the_harness_reports_a_leaked_task() -> None:
    leaking = Protocol("leaky", "nbsync with a leak", NbsyncParams, NbsyncServer,
                       LeakingWorker)
    with pytest.raises(RuntimeError, match="outlived the run: forgotten"):
        await asyncio.to_thread(run_virtual, leaking, tiny_model,
                                lambda rank: batches_of(*tiny_data(), rank), [0.01],
                                settings=ServerSettings(), max_steps=3)


async def test_async_server_mode_applies_each_delta_on_arrival() -> None:
    core, finals = await run_local("nbsync", [0.0, 0.005, 0.02],
                                   params=NbsyncParams(server_mode="async"), time_s=1.0)
    assert core.store.version >= 20
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert sum(core.store.held_s.values()) == 0.0  # nobody waits for a round
    assert core.store.staleness.count == core.store.version
    assert finals[0]["steps"] > 2 * finals[2]["steps"]


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="server_mode"):
        NbsyncParams(server_mode="lazy")


async def test_nbsync_over_http() -> None:
    core, finals = await run_http("nbsync", workers=3, time_s=1.0)
    assert core.store.version > 3
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
