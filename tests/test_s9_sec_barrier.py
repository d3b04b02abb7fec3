"""A worker that dies at the start barrier: its join is withdrawn when its connection
closes, so a restarted copy takes the rank back at once (even with no worker timeout);
a join without a secret takes it over anyway (tests/test_s13_joinfix_resent_join.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from asyncsync.clock import now
from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import StreamConnection
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header
from tests.helpers import tiny_model

RUN = "barrier"
JOIN = encode_header({"worker": 0, "run_id": RUN}, None)


async def held_join(url: str, channel: str) -> Callable[[], None]:
    """Send rank 0's join on a connection of its own (it waits at the barrier); returns
    what closes that connection, as a dying process's kernel does."""
    if channel == "stream":
        stream = await StreamConnection.open(url, None, None, None)

        async def pieces() -> AsyncIterator[bytes]:
            yield JOIN

        await stream.send("join", len(JOIN), pieces())
        return stream.close
    parts = urlsplit(url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"POST /v1/join HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: "
                 f"{CONTENT_TYPE}\r\nContent-Length: {len(JOIN)}\r\n\r\n".encode() + JOIN)
    await writer.drain()
    return writer.close


async def join(session: aiohttp.ClientSession, url: str, worker: int) -> tuple[int, bytes]:
    async with session.post(f"{url}/v1/join", data=encode_header(
            {"worker": worker, "run_id": RUN}, None),
            headers={"Content-Type": CONTENT_TYPE}) as resp:
        return resp.status, await resp.read()


async def join_while_refused(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    """Rank 0's join, retried while refused as a live session's (as a worker retries)."""
    deadline = now() + 10.0
    while True:
        status, body = await join(session, url, 0)
        if status != 409 or now() > deadline:
            return status, body
        await asyncio.sleep(0.05)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def session_of(body: bytes) -> Any:
    (size,) = PREFIX.unpack(body[:PREFIX.size])
    return decode_header(body[PREFIX.size:PREFIX.size + size])["meta"]["session"]


@pytest.mark.parametrize("channel", ["http", "stream"])
async def test_a_worker_restarted_at_the_start_barrier_takes_its_rank_back(
        channel: str) -> None:
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "bsp", 2, settings) as server, \
            aiohttp.ClientSession() as session:
        core = server.core
        close_first = await held_join(server.url, channel)
        await until(lambda: 0 in core.store.live)
        first = core.workers[0].session
        close_first()  # the first copy of worker 0 dies
        restarted = asyncio.create_task(join_while_refused(session, server.url))
        await until(lambda: core.workers[0].session not in ("", first))  # its join held
        other = await join(session, server.url, 1)
        status, body = await asyncio.wait_for(restarted, 15)
        assert status == 200, body
        assert other[0] == 200 and core.run.started
        assert core.workers[0].session == session_of(body)
        assert core.store.live == {0, 1}


async def test_in_process_a_join_cancelled_at_the_start_barrier_is_withdrawn() -> None:
    """The in-process transport's counterpart: a worker task cancelled while its join
    waits (the embedding's way to kill a worker) leaves the rank free."""
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN,
                                                             worker_timeout_s=None))
    try:
        first = asyncio.create_task(LocalTransport(core).request(
            "join", {"worker": 0, "run_id": RUN}))
        await until(lambda: 0 in core.store.live)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await until(lambda: 0 not in core.store.live)
        again = asyncio.create_task(LocalTransport(core).request(
            "join", {"worker": 0, "run_id": RUN}))
        await LocalTransport(core).request("join", {"worker": 1, "run_id": RUN})
        reply, _ = await asyncio.wait_for(again, 10)
        assert core.workers[0].session == reply["meta"]["session"]
        assert core.run.started and core.store.live == {0, 1}
    finally:
        await core.stop()
        await core.close()
