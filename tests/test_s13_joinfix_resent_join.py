"""A join re-sent while the first one is held at the start barrier (its client timed out
and retried, its proxy re-sent it, or a second process was started with the rank) takes
the held one over: the held join is answered with a 403 that says why, the newer one gets
the rank's only session when the run starts, and the run log has one join per rank and
no lost worker. Before session 13 the re-sent join was refused (409) while the first one's
connection stayed open, and a join held ``away`` was given a second secret beside the
first: two sessions for one rank. In process and over HTTP (both channels)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.protocols.base import Forbidden
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, tiny_data, tiny_model

RUN = "resent"


def join_head(worker: int, **fields: Any) -> dict[str, Any]:
    """A join as a fresh worker sends it: no secret yet (the worker's empty one)."""
    return {"run_id": RUN, "worker": worker, "session": "", "meta": {}, **fields}


async def refusal_of_held(held: asyncio.Future[Any], resent: asyncio.Future[Any]
                          ) -> BaseException | None:
    """What the held join ends with once the re-sent one has arrived (before the run
    starts); fails when the re-sent one is refused instead, or nothing happens."""
    await asyncio.wait({held, resent}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    if resent.done():
        raise AssertionError(f"the re-sent join was answered first: {resent.exception()!r}")
    assert held.done(), "the held join was neither refused nor answered"
    return held.exception()


def one_session_per_rank(core: ServerCore, sessions: list[str]) -> None:
    """Every rank holds the one secret its client was answered with."""
    assert [record.session for record in core.workers] == sessions


def one_join_per_rank(events: Path) -> None:
    """The run log has one join per rank, and no lost or rejoined worker."""
    kinds: list[tuple[str, int]] = [(e[KEY], e.get("worker", -1)) for e in read_jsonl(events)]
    assert sorted(w for k, w in kinds if k == Kind.JOIN) == [0, 1], kinds
    assert not [k for k, _ in kinds if k in (Kind.WORKER_LOST, Kind.REJOIN)], kinds


@pytest.mark.parametrize("away", [False, True])
async def test_in_process_a_resent_join_takes_over_the_held_one(tmp_path: Path,
                                                                away: bool) -> None:
    events = tmp_path / "events.jsonl"
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN,
                                                             worker_timeout_s=None),
                      events=JsonlLog(events))
    try:
        fields = {"away": True} if away else {}
        held = asyncio.ensure_future(LocalTransport(core).request("join",
                                                                  join_head(0, **fields)))
        await asyncio.sleep(0.05)
        assert not held.done()  # waits for worker 1
        resent = asyncio.ensure_future(LocalTransport(core).request("join",
                                                                    join_head(0, **fields)))
        refusal = await refusal_of_held(held, resent)  # at once, before the run starts
        assert isinstance(refusal, Forbidden), refusal
        assert "taken over by a newer join of rank 0" in str(refusal)
        assert not core.run.started and not resent.done()
        other, _ = await LocalTransport(core).request("join", join_head(1))
        answer, _ = await asyncio.wait_for(resent, 10)
        one_session_per_rank(core, [answer["meta"]["session"], other["meta"]["session"]])
        assert (0 in core.store.live) is not away
    finally:
        await core.stop()
        await core.close()
    one_join_per_rank(events)


@pytest.mark.parametrize("channel", ["stream", "http"])
async def test_over_http_a_resent_join_takes_over_the_held_one(tmp_path: Path,
                                                               channel: str) -> None:
    events = tmp_path / "events.jsonl"
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "bsp", 2, settings,
                               events=JsonlLog(events)) as server:
        numel = server.core.store.numel
        clients = [HttpTransport(server.url, numel, timeout_s=20, channel=channel)
                   for _ in range(3)]
        try:
            held = asyncio.ensure_future(clients[0].request("join", join_head(0)))
            await asyncio.sleep(0.3)
            assert not held.done()  # its connection stays open: nothing withdraws it
            resent = asyncio.ensure_future(clients[1].request("join", join_head(0)))
            refusal = await refusal_of_held(held, resent)
            assert isinstance(refusal, Forbidden), refusal  # a 403, never a 5xx
            assert "taken over by a newer join of rank 0" in str(refusal)
            other, _ = await clients[2].request("join", join_head(1))
            answer, model = await asyncio.wait_for(resent, 10)
            assert model is not None and answer["version"] == 0
            one_session_per_rank(server.core, [answer["meta"]["session"],
                                               other["meta"]["session"]])
            await server.stop()
        finally:
            for client in clients:
                await client.close()
    one_join_per_rank(events)


async def test_a_second_worker_process_given_a_waiting_rank_takes_it_over(
        tmp_path: Path) -> None:
    """Two `Worker`s started with rank 0 before the run starts: the earlier one ends at once
    with the 403 that names the takeover (before: the later one was refused, 409, retried
    for two minutes, and ended), the later one trains with worker 1."""
    x, y = tiny_data()
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)

    def worker(rank: int, url: str, seed: int) -> Worker:
        return Worker.connect(rank, url, tiny_model(), batches_of(x, y, seed), "asp",
                              run_id=RUN, max_steps=5, heartbeat_s=None)

    async with ParameterServer(tiny_model(), "asp", 2, settings,
                               events=JsonlLog(tmp_path / "events.jsonl")) as server:
        first = asyncio.ensure_future(worker(0, server.url, 0).run())
        await asyncio.sleep(0.5)
        assert not first.done()
        second = asyncio.ensure_future(worker(0, server.url, 1).run())
        refusal = await refusal_of_held(first, second)
        assert isinstance(refusal, Forbidden) and "taken over" in str(refusal), refusal
        totals = await asyncio.wait_for(asyncio.gather(second, worker(1, server.url, 2).run()),
                                        60)
        assert [t["steps"] for t in totals] == [5, 5]
        assert server.core.store.version == 10  # ASP: one version per push, each counted once
        assert torch.isfinite(server.core.store.w).all()
        await server.stop()
