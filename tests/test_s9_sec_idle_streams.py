"""A stream between frames waits for its next request like an idle keep-alive
connection, so a new connection over a limit may take its place (before, a stream counted
as inside one request for its whole life: streams opened and left idle, or trickling a
byte of frame head now and then, held every slot of the gate). A stream inside a frame is
never evicted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.frame_stream import StreamConnection
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model

RUN = "idle-streams"


async def status(url: str) -> int:
    """A status request on a connection of its own, closed after the answer."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    body = encode_header({}, None)
    writer.write(f"POST /v1/status HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: "
                 f"{CONTENT_TYPE}\r\nConnection: close\r\nContent-Length: {len(body)}"
                 "\r\n\r\n".encode() + body)
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        return int(head.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize("state, answer", [("idle", 200), ("mid-frame", 503)])
async def test_a_stream_waiting_between_frames_makes_room_for_a_new_connection(
        state: str, answer: int) -> None:
    limits = ConnectionLimits(max_per_peer=1, header_timeout_s=4.0)  # (silent grace: 1 s)
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN),
                               connections=limits) as server:
        stream = await StreamConnection.open(server.url, None, None, None)
        try:
            if state == "mid-frame":  # a frame's first bytes: inside it
                data = encode_header({"run_id": RUN, "pad": "x" * 40}, None)

                async def part() -> AsyncIterator[bytes]:
                    yield data[:-8]

                await stream.send("status", len(data), part())
            await asyncio.sleep(1.2)  # (a frame is answered 408 after 4 s)
            assert await status(server.url) == answer
            assert server.gate.evicted == (answer == 200)
        finally:
            stream.close()
