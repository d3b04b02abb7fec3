"""A request body that trickles in slower than the minimum rate is answered 408 and its
connection closed, over HTTP and on the stream channel; bodies at a normal pace pass."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.frame_stream import REPLY, REQUEST
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model

WITHIN_S = 30.0
"""How long an answer may take (generous: the pace is cut after about 2 seconds)."""
BODY = encode_header({"padding": "x" * 400}, None)
"""A status request's body of over 400 bytes: at 20 bytes/s, far behind 100 bytes/s."""
TRICKLE_S = 0.05


@pytest.fixture
async def server() -> AsyncIterator[ParameterServer]:
    # The pace is judged from header_timeout_s into the body; over HTTP the gate closes
    # the connection that long after the 408, and a client still trickling then gets a
    # reset, which drops what of the 408 it has not read: 2 s leaves a loaded test time.
    limits = ConnectionLimits(header_timeout_s=2.0, min_body_bytes_per_s=100)
    async with ParameterServer(tiny_model(), "asp", 1, connections=limits) as live:
        yield live


async def open_stream(server: ParameterServer,
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream upgraded on a new connection, and the head of a status frame of `BODY`'s
    length sent (its body is the caller's to send)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                 b"Upgrade: tcp\r\nContent-Length: 0\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
    assert head.startswith(b"HTTP/1.1 101"), head
    writer.write(REQUEST.pack(len(b"status"), len(BODY)) + b"status")
    return reader, writer


async def trickle(writer: asyncio.StreamWriter, body: bytes, answered: asyncio.Task[bytes],
                  ) -> None:
    """Send `body` a byte every `TRICKLE_S` until the server answers."""
    for byte in body:
        if answered.done():
            return
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(TRICKLE_S)


async def test_a_trickling_http_body_is_answered_408(server: ParameterServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Type: " + CONTENT_TYPE.encode()
                 + b"\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n")

    async def response() -> bytes:  # by its length: the close may come as a reset
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head, re.IGNORECASE)
        assert length, head
        return head + await reader.readexactly(int(length[1]))

    answered = asyncio.ensure_future(asyncio.wait_for(response(), WITHIN_S))
    await trickle(writer, BODY, answered)
    answer = await answered
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"the body arrived slower than 100 bytes/s" in answer


async def test_a_trickling_stream_frame_is_answered_408(server: ParameterServer) -> None:
    reader, writer = await open_stream(server)

    async def answer() -> bytes:
        status, length = REPLY.unpack(await reader.readexactly(REPLY.size))
        return str(status).encode() + b" " + await reader.readexactly(length)

    answered = asyncio.ensure_future(asyncio.wait_for(answer(), WITHIN_S))
    await trickle(writer, BODY, answered)
    reply = await answered
    assert reply.startswith(b"408 the body arrived slower than 100 bytes/s"), reply
    assert await asyncio.wait_for(reader.read(), WITHIN_S) == b""  # then closed, lingering
    writer.close()


async def test_a_stream_closed_on_an_unread_frame_lingers(server: ParameterServer) -> None:
    """After the 408 the server ends its side and drops what still comes: a client still
    sending reads the answer and then the end, not a reset."""
    reader, writer = await open_stream(server)
    status, length = REPLY.unpack(await asyncio.wait_for(reader.readexactly(REPLY.size),
                                                         WITHIN_S))
    assert status == 408
    await reader.readexactly(length)
    for _ in range(5):  # the rest of the body, after the answer
        writer.write(BODY[:20])
        await writer.drain()
        await asyncio.sleep(0.05)
    assert await asyncio.wait_for(reader.read(), WITHIN_S) == b""
    writer.close()


@pytest.mark.parametrize("channel", ["http", "stream"])
async def test_a_body_at_a_normal_pace_is_answered(server: ParameterServer,
                                                   channel: str) -> None:
    client = HttpTransport(server.url, 0, timeout_s=WITHIN_S, channel=channel)
    try:
        reply, _ = await client.request("status", {"padding": "x" * 200})
    finally:
        await client.close()
    assert "workers" in reply
