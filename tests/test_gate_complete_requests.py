"""A request that has fully arrived is never shed by the connection gate, and a client
resends a request the server dropped unanswered when resending it is safe."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asyncsync.transport import connection_gate
from asyncsync.transport.connection_gate import BUSY_REPLY, ConnectionGate, ConnectionLimits
from asyncsync.transport.frame_stream import REPLY, REQUEST
from asyncsync.transport.http_client import HttpTransport
from asyncsync.wire.frames import CONTENT_TYPE, encode_header

WITHIN_S = 60.0
"""How long anything the test waits for may take (generous: it takes milliseconds)."""


class FakeTransport(asyncio.Transport):
    """Records what the gate writes and whether it closed the connection."""

    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 1) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False  # closed at once when refused, not read to its end


class Handler(asyncio.Protocol):
    """aiohttp's handler, as far as the gate sees it: it takes the bytes."""

    def __init__(self) -> None:
        self.received = b""

    def data_received(self, data: bytes) -> None:
        self.received += data


async def test_a_complete_request_head_is_not_evicted_before_its_handler_starts() -> None:
    """At the cap (1), a connection whose request head has arrived (in two pieces) but
    whose handler has not started yet keeps its place: the next connection gets 503."""
    gate = ConnectionGate(ConnectionLimits(max_connections=1))
    first, second = FakeTransport("10.0.0.1"), FakeTransport("10.0.0.2")
    protocol = gate.protocol_factory(Handler)
    connection = protocol()
    connection.connection_made(first)
    connection.data_received(b"POST /v1/status HTTP/1.1\r\nHost: x\r\n\r")
    connection.data_received(b"\n")  # the head is complete; aiohttp's task has not run yet
    protocol().connection_made(second)
    assert not first.closed and gate.evicted == 0
    assert second.closed and second.written == BUSY_REPLY and gate.refused == 1
    connection.connection_lost(None)


async def test_a_half_sent_head_is_still_evicted() -> None:
    gate = ConnectionGate(ConnectionLimits(max_connections=1))
    first, second = FakeTransport("10.0.0.1"), FakeTransport("10.0.0.2")
    protocol = gate.protocol_factory(Handler)
    connection = protocol()
    connection.connection_made(first)
    connection.data_received(b"POST /v1/status HTTP/1.1\r\nHost: x\r\n")
    protocol().connection_made(second)
    assert first.closed and gate.evicted == 1 and not second.closed


async def test_a_connection_just_opened_is_not_evicted_but_a_silent_one_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that has sent nothing yet may hold a request not read yet: the next
    one is refused (503); once it has been silent for the grace, it makes room."""
    monkeypatch.setattr(connection_gate, "SILENT_GRACE_S", 0.05, raising=False)
    gate = ConnectionGate(ConnectionLimits(max_connections=1))
    first, second, third = (FakeTransport(f"10.0.0.{n}") for n in (1, 2, 3))
    protocol = gate.protocol_factory(Handler)
    protocol().connection_made(first)
    protocol().connection_made(second)
    assert not first.closed and second.closed and second.written == BUSY_REPLY
    await asyncio.sleep(0.1)  # past the grace, far from the header timeout
    protocol().connection_made(third)
    assert first.closed and gate.evicted == 1 and not third.closed


STATUS_BODY = encode_header({"workers": 1}, None)
STATUS_REPLY = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n"
                f"Content-Length: {len(STATUS_BODY)}\r\n\r\n").encode() + STATUS_BODY


@pytest.mark.parametrize(("op", "resent"), [("status", True), ("heartbeat", True),
                                            ("push", False)])
async def test_a_request_dropped_unanswered_is_resent_only_when_safe(op: str,
                                                                     resent: bool) -> None:
    """A server that closes the first connection after reading its request head, and
    answers the next: status and heartbeats are resent, a push is not (a POST each)."""
    connections = itertools.count()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if next(connections):
            writer.write(STATUS_REPLY)
            await writer.drain()
        writer.close()

    await check_resent_only_when_safe(serve, "http", op, resent)
    assert next(connections) == (2 if resent else 1)


@pytest.mark.parametrize(("op", "resent"), [("status", True), ("heartbeat", True),
                                            ("push", False)])
async def test_a_request_dropped_mid_stream_is_resent_only_when_safe(op: str,
                                                                   resent: bool) -> None:
    """The same on the stream channel: a server that upgrades, reads a request and closes
    the stream unanswered, then answers on the next stream."""
    streams = itertools.count()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                     b"Upgrade: tcp\r\n\r\n")
        name_bytes, length = REQUEST.unpack(await reader.readexactly(REQUEST.size))
        await reader.readexactly(name_bytes + length)
        if next(streams):
            writer.write(REPLY.pack(200, len(STATUS_BODY)) + STATUS_BODY)
            await writer.drain()
        writer.close()

    await check_resent_only_when_safe(serve, "stream", op, resent)
    assert next(streams) == (2 if resent else 1)


async def check_resent_only_when_safe(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    channel: str, op: str, resent: bool,
) -> None:
    """Send `op` on `channel` to a server run by `serve`: it comes back answered when
    `resent`, else as a ConnectionError."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpTransport(f"http://127.0.0.1:{port}", 0, timeout_s=WITHIN_S,
                           channel=channel)
    try:
        if resent:
            reply, _ = await client.request(op, {})
            assert reply == {"workers": 1}
        else:
            with pytest.raises(ConnectionError):
                await client.request(op, {})
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


TOKEN = "burst-token"


def status_request(token: str | None) -> bytes:
    body = encode_header({}, None)
    auth = b"" if token is None else f"Authorization: Bearer {token}\r\n".encode()
    return (b"POST /v1/status HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: "
            + CONTENT_TYPE.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


def answers_to(port: int, requests: list[bytes]) -> list[bytes]:
    """The status line and headers of the answer to each request, each sent whole on a
    connection of its own as soon as it opens, all sent before any answer is read (b"":
    the connection closed unanswered)."""
    sockets = []
    for request in requests:
        sockets.append(socket.create_connection(("127.0.0.1", port), timeout=WITHIN_S))
        sockets[-1].sendall(request)
    answers = []
    for sock in sockets:
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
                answer += chunk
        answers.append(answer)
        sock.close()
    return answers


async def test_a_burst_over_the_per_address_cap_answers_every_complete_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """150 complete status requests at once from one address (cap 128), one of them
    without the token: each gets its answer (200, 401) or 503 with Retry-After; none is
    closed unanswered. With no grace for silent connections, so that what protects each
    request is that it was sent, not how fast the machine admits the burst."""
    monkeypatch.setattr(connection_gate, "SILENT_GRACE_S", 0.0)
    from asyncsync.transport.http_server import ParameterServer
    from tests.helpers import tiny_model

    async with ParameterServer(tiny_model(), "asp", 1, token=TOKEN) as server:
        requests = [status_request(TOKEN)] * 149 + [status_request(None)]
        answers = await asyncio.to_thread(answers_to, server.port, requests)
    status = [a.split(b" ", 2)[1] if a else b"unanswered" for a in answers]
    assert status.count(b"unanswered") == 0, status
    assert status[-1] in (b"401", b"503")
    assert set(status[:-1]) <= {b"200", b"503"} and status.count(b"200") >= 100
    assert all(b"\r\nRetry-After: " in a for a in answers if a.split(b" ", 2)[1] == b"503")
