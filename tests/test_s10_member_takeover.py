"""A worker that dies after the run has started, with no worker timeout, gets its rank
back: a restarted copy (a fresh process: no session secret) takes the rank over. The old
session ends as after a timeout (the rule sees it leave), its secret is refused with a 403
that says why, and the run goes on, in process and over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.engine.compute import ThreadedWorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import StepDelay
from asyncsync.protocols.base import BadRequest, Forbidden, OutOfStep
from asyncsync.protocols.bsp import BspParams
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from asyncsync.transport.status import status_of
from tests.helpers import (
    CuttableTransport,
    batches_of,
    keep_every_commit,
    ranks,
    tiny_data,
    tiny_model,
)
from tests.test_membership import CASES

RUN = "takeover"
LR = 0.5
STEPS = 6


def head(worker: int, secret: object = "", **fields: Any) -> dict[str, Any]:
    return {"run_id": RUN, "worker": worker, "meta": {}, "session": secret, **fields}


def gradient(worker: int, secret: str, seq: int) -> dict[str, Any]:
    return head(worker, secret, kind="gradient", base_version=0, steps=1, samples=8, seq=seq)


async def joined(core: ServerCore, worker: int, secret: str = "") -> str:
    reply, _ = await core.handle("join", head(worker, secret), None)
    return str(reply["meta"]["session"])


async def test_a_fresh_join_takes_over_and_the_old_push_does_not_count(tmp_path: Path) -> None:
    """BSP, two workers: worker 1 pushes 4s and dies before the round closes. Its restart
    takes the rank over; the round closes with worker 0's 1s and the new worker 1's 2s:
    w - lr * (1 + 2) / 2, by hand, not w - lr * (1 + 4) / 2 nor a mean of three."""
    events = tmp_path / "events.jsonl"
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN, lr=LR,
                                                             worker_timeout_s=None),
                      events=JsonlLog(events))
    numel, start = core.store.numel, core.store.w.clone()
    try:
        first, old = await asyncio.gather(joined(core, 0), joined(core, 1))
        await core.handle("push", gradient(1, old, 1), torch.full((numel,), 4.0))
        new = await asyncio.wait_for(joined(core, 1), 5)  # no secret: a restarted copy
        assert new != old and core.workers[1].lost == 1
        for op, fields in [("push", gradient(1, old, 2)), ("pull", head(1, old, base_version=0)),
                           ("heartbeat", head(1, old)), ("leave", head(1, old)),
                           ("join", head(1, old))]:
            with pytest.raises(Forbidden, match="taken over by a newer join of rank 1"):
                await core.handle(op, fields, torch.zeros(numel) if op == "push" else None)
        await asyncio.gather(
            core.handle("push", gradient(0, first, 1), torch.full((numel,), 1.0)),
            core.handle("push", gradient(1, new, 1), torch.full((numel,), 2.0)))
        assert core.store.version == 1
        assert torch.allclose(core.store.w, start - LR * 1.5)
    finally:
        await core.stop()
        await core.close()
    logged = [(e[KEY], e.get("worker"), e.get("replaced")) for e in read_jsonl(events)]
    assert (Kind.WORKER_LOST, 1, True) in logged and (Kind.REJOIN, 1, None) in logged


async def test_a_join_with_a_wrong_secret_or_before_the_start_takes_nothing() -> None:
    """Only a join without a secret takes a rank over: one carrying another secret is
    refused (409), before the start (the held join keeps its rank) and after it."""
    core = build_core(tiny_model(), "asp", 2, ServerSettings(run_id=RUN, worker_timeout_s=None))
    try:
        waiting = asyncio.ensure_future(core.handle("join", head(0), None))
        await asyncio.sleep(0.05)
        with pytest.raises(OutOfStep, match="does not carry"):
            await core.handle("join", head(0, "0" * 32), None)
        await joined(core, 1)
        secret = (await waiting)[0]["meta"]["session"]
        with pytest.raises(OutOfStep, match="does not carry"):
            await core.handle("join", head(0, "0" * 32), None)
        assert core.workers[0].session == secret and core.workers[0].lost == 0
    finally:
        await core.stop()
        await core.close()


@pytest.mark.parametrize("secret", [0, False, [], {}, b""])
async def test_a_join_whose_secret_is_not_a_string_is_a_400_and_takes_nothing(
        secret: object) -> None:
    """A falsy non-string secret is malformed, not "no secret": it takes no rank over."""
    core = build_core(tiny_model(), "asp", 1, ServerSettings(run_id=RUN, worker_timeout_s=None))
    try:
        owner = await joined(core, 0)
        with pytest.raises(BadRequest, match="'session' must be a str"):
            await core.handle("join", head(0, secret), None)
        assert core.workers[0].session == owner and core.workers[0].lost == 0
    finally:
        await core.stop()
        await core.close()


def worker(rank: int, transport: Any, steps: int = STEPS) -> Worker:
    x, y = tiny_data()
    return Worker(rank, transport, tiny_model(), batches_of(x, y, rank), "bsp", run_id=RUN,
                  lr=0.1, batch_size=16, max_steps=steps, heartbeat_s=0.1,
                  seam=ThreadedWorkerSeam(StepDelay(0.005)))


async def until(ready: Any, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not ready():
            await asyncio.sleep(0.01)


async def test_a_killed_worker_restarted_in_process_finishes_the_run() -> None:
    """Worker 1 is cut off mid-run (no leave, no heartbeat: a killed process) with no
    worker timeout, so BSP waits for it; its restart takes the rank over and both
    workers finish their steps."""
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN, worker_timeout_s=None))
    victim = CuttableTransport(core)
    tasks = [asyncio.create_task(worker(0, LocalTransport(core)).run()),
             asyncio.create_task(worker(1, victim, steps=10**6).run())]
    try:
        await until(lambda: core.store.version >= 2)
        victim.cut = True
        tasks[1].cancel()
        await asyncio.gather(tasks[1], return_exceptions=True)
        stalled = core.store.version
        restarted = worker(1, LocalTransport(core))
        finals = await asyncio.wait_for(asyncio.gather(tasks[0], restarted.run()), 30)
    finally:
        await core.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await core.close()
    assert [f["steps"] for f in finals] == [STEPS, STEPS]
    assert core.store.version > stalled and torch.isfinite(core.store.w).all()
    assert core.workers[1].lost == 1 and core.workers[1].left


async def test_a_killed_worker_restarted_over_http_takes_over_its_rank() -> None:
    """Over HTTP: worker 1's first session joins, pushes and vanishes (its connections
    closed, as the kernel closes a killed process's); a restarted worker 1 takes the rank
    over and the run finishes; the old session's secret then gets a 403."""
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "bsp", 2, settings) as server:
        core = server.core
        survivor = asyncio.create_task(worker(0, HttpTransport(server.url, core.store.numel))
                                       .run())
        dead = HttpTransport(server.url, core.store.numel)
        try:
            reply, _ = await dead.request("join", head(1))
            old = reply["meta"]["session"]
            await until(lambda: core.run.started)
            await dead.request("push", gradient(1, old, 1), torch.zeros(core.store.numel))
        finally:
            await dead.close()
        restarted = asyncio.create_task(
            worker(1, HttpTransport(server.url, core.store.numel)).run())
        stale = HttpTransport(server.url, core.store.numel)
        try:
            await until(lambda: core.workers[1].lost == 1)
            with pytest.raises(Forbidden) as refused:
                await stale.request("heartbeat", head(1, old))
        finally:
            await stale.close()
        finals = await asyncio.wait_for(asyncio.gather(survivor, restarted), 60)
        assert [f["steps"] for f in finals] == [STEPS, STEPS]
        assert core.store.version >= STEPS and torch.isfinite(core.store.w).all()
    assert status_of(refused.value) == 403 and "taken over" in str(refused.value)


async def test_a_live_duplicate_is_told_it_was_taken_over_and_stops() -> None:
    """Two live workers with rank 1 do not take the rank from each other in turn: the
    later join wins, and the earlier one's next request ends it with a 403 saying why."""
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN, worker_timeout_s=None))
    tasks = [asyncio.create_task(worker(0, LocalTransport(core), steps=40).run()),
             asyncio.create_task(worker(1, LocalTransport(core), steps=10**6).run())]
    try:
        await until(lambda: core.store.version >= 2)
        later = asyncio.create_task(worker(1, LocalTransport(core), steps=40).run())
        with pytest.raises(Forbidden, match="taken over"):
            await asyncio.wait_for(tasks[1], 20)
        finals = await asyncio.wait_for(asyncio.gather(tasks[0], later), 30)
    finally:
        await core.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await core.close()
    assert [f["steps"] for f in finals] == [40, 40] and core.workers[1].lost == 1


async def test_takeovers_in_a_loop_do_not_flood_the_servers_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each takeover is an event, but its warning line is rate-limited (a token holder
    could join in a loop): 30 takeovers within a second or two give a line or two."""
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "asp", 1, settings) as server:
        transport = HttpTransport(server.url, server.core.store.numel)
        try:
            await asyncio.sleep(1.1)  # past the last second of earlier tests' lines
            with caplog.at_level("WARNING", logger="asyncsync.server"):
                for _ in range(31):
                    await transport.request("join", head(0))
        finally:
            await transport.close()
        assert server.core.workers[0].lost == 30
    lines = [r for r in caplog.records if "takes the rank over" in r.getMessage()]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]


async def test_a_push_of_the_old_session_still_being_checked_is_refused_after_a_takeover(
        ) -> None:
    """A push that passed its session check, and waits while its tensor is checked for
    NaN/Inf, is refused (403) if its session is taken over meanwhile: the old process's
    update never lands in the new session's name."""
    core = build_core(tiny_model(), "asp", 1, ServerSettings(run_id=RUN, lr=LR,
                                                             worker_timeout_s=None))
    release, checking = asyncio.Event(), asyncio.Event()
    compute = core.store.compute

    async def held(fn: Any, *args: Any) -> Any:
        checking.set()
        await release.wait()
        return await compute(fn, *args)

    try:
        old = await joined(core, 0)
        start = core.store.w.clone()
        core.store.compute = held  # type: ignore[method-assign]
        pushed = asyncio.ensure_future(core.handle(
            "push", gradient(0, old, 1), torch.ones(core.store.numel)))
        await checking.wait()
        core.store.compute = compute  # type: ignore[method-assign]
        await joined(core, 0)  # a restarted copy takes the rank over
        release.set()
        with pytest.raises(Forbidden, match="taken over"):
            await pushed
        assert core.store.version == 0 and torch.equal(core.store.w, start)
    finally:
        await core.stop()
        await core.close()


@pytest.mark.parametrize(("protocol", "params", "delays", "victim", "full"), CASES,
                         ids=[case[0] + ("-backup" if isinstance(case[1], BspParams) else "")
                              for case in CASES])
async def test_every_protocol_goes_on_after_a_takeover_without_a_timeout(
        protocol: str, params: Any, delays: list[float], victim: int, full: bool) -> None:
    """No worker timeout: a worker is cut off mid-run and a fresh copy started at once;
    its takeover lets the protocol go on, and a later commit includes the new copy."""
    x, y = tiny_data()
    core = keep_every_commit(build_core(tiny_model(), protocol, len(delays), ServerSettings(
        run_id=RUN, lr=0.1, worker_timeout_s=None), protocol_params=params))

    def start(rank: int, transport: LocalTransport) -> asyncio.Task[dict[str, Any]]:
        return asyncio.create_task(Worker(
            rank, transport, tiny_model(), batches_of(x, y, rank), protocol, run_id=RUN,
            protocol_params=params, lr=0.1, batch_size=16, heartbeat_s=0.1,
            seam=ThreadedWorkerSeam(StepDelay(delays[rank]))).run())

    cut = CuttableTransport(core)
    tasks = [start(rank, cut if rank == victim else LocalTransport(core))
             for rank in range(len(delays))]
    try:
        await until(lambda: core.store.version >= 3)
        cut.cut = True
        tasks[victim].cancel()
        await asyncio.gather(tasks[victim], return_exceptions=True)
        restarted_at = core.store.version
        tasks[victim] = start(victim, LocalTransport(core))
        await until(lambda: any(victim in ranks(c) for c in core.store.commits
                                if c.version > restarted_at + 1), 30)
    finally:
        await core.stop()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await core.close()
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert core.workers[victim].lost == 1 and torch.isfinite(core.store.w).all()
    back = [c for c in core.store.commits if c.version > restarted_at + 1 and victim in ranks(c)]
    if full:  # a full round again: one contribution from each worker
        assert ranks(back[0]) == set(range(len(delays))), back[0]
