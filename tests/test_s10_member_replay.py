"""Replayed queries and leaves. A query may move a rule's state (ESync's oracle takes the
step time a query reports), so queries are numbered like pushes and a replay is a 409. A
leave needs no number: every join gives a new secret, so a leave sent again cannot remove
the worker once it has rejoined (403), and finds it already out before that (410)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import torch

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import BadRequest, Forbidden, NotInRun, OutOfStep
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model
from tests.test_s9_sec_replay import record_headers

RUN = "replays"


def head(worker: int, secret: str, **fields: Any) -> dict[str, Any]:
    return {"run_id": RUN, "worker": worker, "meta": {}, "session": secret, **fields}


def query(worker: int, secret: str, seq: int | None, k: int, c: float) -> dict[str, Any]:
    numbered = {} if seq is None else {"seq": seq}
    return {**head(worker, secret, **numbered), "meta": {"k": k, "c": c}}


async def started(core: ServerCore) -> list[str]:
    replies = await asyncio.gather(*(core.handle("join", head(w, ""), None)
                                     for w in range(len(core.workers))))
    return [str(reply["meta"]["session"]) for reply, _ in replies]


async def test_a_replayed_esync_query_is_refused_and_the_oracle_keeps_the_new_step_time(
        ) -> None:
    """Worker 0 reports a 1 s step, then a 0.01 s one. Worker 1 (0.1 s steps) is then the
    slowest and so ready at once; a replay of the 1 s report would make worker 0 the
    slowest again, with a second left, and worker 1 would not be (0.1 x 1.5 < 1)."""
    core = build_core(tiny_model(), "esync", 2, ServerSettings(run_id=RUN,
                                                               worker_timeout_s=None))
    try:
        secrets = await started(core)
        old = query(0, secrets[0], 1, k=1, c=1.0)
        await core.handle("query", old, None)
        await core.handle("query", query(0, secrets[0], 2, k=2, c=0.01), None)
        with pytest.raises(OutOfStep, match="query 1 was already received"):
            await core.handle("query", old, None)
        reply, _ = await core.handle("query", query(1, secrets[1], 1, k=1, c=0.1), None)
        assert reply["meta"]["sync"] is True
        with pytest.raises(BadRequest, match="query without 'seq'"):
            await core.handle("query", query(0, secrets[0], None, k=3, c=0.01), None)
    finally:
        await core.close()


async def test_queries_of_a_session_never_numbered_are_not_checked() -> None:
    """A hand-built client that numbers no query is answered as before."""
    core = build_core(tiny_model(), "esync", 1, ServerSettings(run_id=RUN,
                                                               worker_timeout_s=None))
    try:
        (secret,) = await started(core)
        for _ in range(2):
            reply, _ = await core.handle("query", query(0, secret, None, k=0, c=0.0), None)
            assert reply["meta"]["sync"] is False
    finally:
        await core.close()


@pytest.mark.parametrize("channel", ["stream", "http"])
async def test_the_transport_numbers_queries_and_a_replayed_query_frame_is_a_409(
        channel: str) -> None:
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "esync", 1, settings) as server:
        seen = record_headers(server.core)
        transport = HttpTransport(server.url, server.core.store.numel, channel=channel)
        try:
            reply, _ = await transport.request("join", head(0, ""))
            secret = reply["meta"]["session"]
            for k in (1, 2):
                await transport.request("query", query(0, secret, None, k=k, c=0.01))
            await transport.request("push", {
                **head(0, secret), "kind": "delta", "steps": 2, "samples": 8,
                "base_version": 0}, torch.zeros(server.core.store.numel))
        finally:
            await transport.close()
        numbers = [(h["op"], h.get("seq")) for h in seen if h["op"] in ("query", "push")]
        assert numbers == [("query", 1), ("query", 2), ("push", 1)]
        replayed = {k: v for k, v in seen[1].items() if k != "op"}
        async with aiohttp.ClientSession() as session, session.post(
                f"{server.url}/v1/query", data=encode_header(replayed, None),
                headers={"Content-Type": CONTENT_TYPE}) as resp:
            assert (resp.status, "already received" in await resp.text()) == (409, True)


async def test_a_replayed_leave_does_not_remove_the_rejoined_worker() -> None:
    core = build_core(tiny_model(), "asp", 2, ServerSettings(run_id=RUN, worker_timeout_s=None))
    try:
        first, _ = await started(core)
        leave = head(0, first)
        await core.handle("leave", leave, None)
        with pytest.raises(NotInRun):  # sent again before the rejoin: already out
            await core.handle("leave", leave, None)
        reply, _ = await core.handle("join", head(0, first), None)  # rejoins: a new secret
        second = reply["meta"]["session"]
        with pytest.raises(Forbidden, match="session secret"):
            await core.handle("leave", leave, None)
        reply, _ = await core.handle("join", head(0, ""), None)  # a restart takes over
        with pytest.raises(Forbidden, match="taken over"):
            await core.handle("leave", head(0, second), None)
        assert 0 in core.store.live and core.workers[0].session == reply["meta"]["session"]
    finally:
        await core.close()
