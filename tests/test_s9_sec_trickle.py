"""Trickled pushes: a rank may have only a few request bodies arriving at once; one more
is answered 429 with a reason before its body is read, on either channel, and the slots
free again when the bodies end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.frame_stream import StreamConnection
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "trickle"


class Sender:
    """Raw requests to one server: stalled mid-body, or whole."""

    def __init__(self, server: ParameterServer) -> None:
        self.url = server.url
        self.core = server.core
        self.open: list[asyncio.StreamWriter | StreamConnection] = []

    def push(self, secret: str, seq: int) -> bytes:
        vector = torch.full((self.core.store.numel,), 0.01)
        header = {"worker": 0, "run_id": RUN, "session": secret, "kind": "gradient",
                  "steps": 1, "samples": 4, "base_version": self.core.store.version,
                  "seq": seq}
        return encode_header(header, vector) + b"".join(
            bytes(p) for p in tensor_chunks(vector))

    async def http(self, op: str, body: bytes, send: int) -> asyncio.StreamReader:
        """POST `op` declaring `body`, sending its first `send` bytes."""
        parts = urlsplit(self.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(f"POST /v1/{op} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: "
                     f"{CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body[:send])
        await writer.drain()
        self.open.append(writer)
        return reader

    async def stream(self, op: str, body: bytes, send: int) -> StreamConnection:
        stream = await StreamConnection.open(self.url, None, None, None)
        self.open.append(stream)

        async def pieces() -> AsyncIterator[bytes]:
            yield body[:send]

        await stream.send(op, len(body), pieces())
        return stream

    def close_all(self) -> None:
        for connection in self.open:
            connection.close()
        self.open.clear()


async def http_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(head.split()[1]), await reader.readexactly(length)


@pytest.fixture
async def sender() -> AsyncIterator[tuple[Sender, str]]:
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "asp", 1, settings) as server:
        sender = Sender(server)
        reader = await sender.http("join", encode_header({"worker": 0, "run_id": RUN}, None),
                                   1 << 20)
        status, body = await http_answer(reader)
        assert status == 200
        (size,) = PREFIX.unpack(body[:PREFIX.size])
        secret: Any = decode_header(body[PREFIX.size:PREFIX.size + size])["meta"]["session"]
        try:
            yield sender, secret
        finally:
            sender.close_all()


@pytest.mark.parametrize("channel", ["http", "stream"])
async def test_a_rank_trickling_more_bodies_than_its_slots_is_refused_429(
        sender: tuple[Sender, str], channel: str) -> None:
    client, secret = sender
    most = ConnectionLimits().max_bodies_per_rank
    head = PREFIX.size + PREFIX.unpack(client.push(secret, 1)[:PREFIX.size])[0]
    for seq in range(1, most + 1):  # each stalls 100 bytes into its tensor
        await client.http("push", client.push(secret, seq), head + 100)
    await asyncio.sleep(0.2)  # (their heads are read)
    extra = client.push(secret, most + 1)
    if channel == "http":
        status, reason = await asyncio.wait_for(
            http_answer(await client.http("push", extra, head)), 5)
    else:
        stream = await client.stream("push", extra, head)
        status, length = await asyncio.wait_for(stream.reply(), 5)
        reason = await stream.receiver.read_exactly(length)
    assert (status, b"at most" in reason) == (429, True), (status, reason)
    assert client.core.store.version == 0
    client.close_all()  # the stalled bodies end: their slots are free again
    await asyncio.sleep(0.2)
    whole = client.push(secret, most + 2)
    status, reason = await http_answer(await client.http("push", whole, len(whole)))
    assert status == 200, reason
    assert client.core.store.version == 1


@pytest.mark.parametrize("field, value", [
    ("max_connections", 1.5), ("max_per_peer", True), ("max_bodies_per_rank", 2.0),
    ("header_timeout_s", float("inf")), ("keepalive_s", "75"),
    ("min_body_bytes_per_s", float("nan")), ("max_bodies_per_rank", 0)])
def test_connection_limits_of_the_wrong_kind_are_refused_by_name(field: str,
                                                                   value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ConnectionLimits(**{field: value})


@pytest.mark.parametrize("channel", ["http", "stream"])
async def test_a_push_over_its_ranks_slots_is_retried_by_the_transport(channel: str) -> None:
    """An honest worker over the cap (e.g. many fragments in flight on a slow link) is
    not ended by the 429: its transport retries, as after a busy server's 503."""
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    limits = ConnectionLimits(max_bodies_per_rank=1)
    async with ParameterServer(tiny_model(), "asp", 1, settings, connections=limits) as server:
        client = Sender(server)
        transport = HttpTransport(server.url, server.core.store.numel, channel=channel)
        try:
            reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN})
            secret = reply["meta"]["session"]
            stalled = client.push(secret, 1)
            head = PREFIX.size + PREFIX.unpack(stalled[:PREFIX.size])[0]
            await client.http("push", stalled, head + 100)  # holds the rank's one slot
            await asyncio.sleep(0.2)
            push = asyncio.create_task(transport.request("push", {
                "worker": 0, "run_id": RUN, "session": secret, "kind": "gradient",
                "steps": 1, "samples": 4, "base_version": 0},
                torch.full((server.core.store.numel,), 0.01)))
            await asyncio.sleep(0.5)  # refused 429 meanwhile, and retried
            assert not push.done() and server.core.store.version == 0
            client.close_all()  # the slot frees
            await asyncio.wait_for(push, 10)
            assert server.core.store.version == 1
        finally:
            client.close_all()
            await transport.close()
