"""Clients that leave mid-request: the server logs one rate-limited line, never a
traceback, and goes on serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import HTTP_LOG, ParameterServer
from asyncsync.transport.log_filters import PeerErrorFilter, RepeatFilter
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model

RUN = "disconnects"
WITHIN_S = 60.0
"""How long anything the test waits for may take (generous: it takes milliseconds)."""


def request(op: str, body: bytes, length: int | None = None) -> bytes:
    """A raw request for `op` with `body` and a Content-Length (default: the body's)."""
    return (f"POST /v1/{op} HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body


@pytest.fixture(autouse=True)
def fresh_log_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rate limit starts afresh (another test's line of the same kind is not held)."""
    monkeypatch.setattr(HTTP_LOG, "filters", [RepeatFilter(), PeerErrorFilter()])


@pytest.fixture
async def server() -> AsyncIterator[ParameterServer]:
    async with ParameterServer(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN)) as live:
        yield live


def disconnect_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("asyncsync.server")
            and ("left" in r.getMessage() or "Error handling request" in r.getMessage())]


async def still_serves(server: ParameterServer) -> None:
    client = HttpTransport(server.url, 0, timeout_s=WITHIN_S)
    try:
        reply, _ = await client.request("status", {})
    finally:
        await client.close()
    assert "workers" in reply


async def test_a_client_that_closes_mid_body_is_one_line_without_a_traceback(
    server: ParameterServer, caplog: pytest.LogCaptureFixture,
) -> None:
    body = encode_header({"worker": 0, "run_id": RUN}, None)
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("join", body[:3], length=len(body)))  # the head, part of the body
        await writer.drain()
        await asyncio.sleep(0.2)  # the handler is reading the body
        writer.close()
        await asyncio.wait_for(reader.read(), WITHIN_S)
        await still_serves(server)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    lines = disconnect_lines(caplog)
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "left" in lines[0].getMessage()


async def test_a_client_that_left_while_its_request_waited_is_one_line_without_a_traceback(
    server: ParameterServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Worker 0's join waits for worker 1's; its client leaves before the reply."""
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("join", encode_header({"worker": 0, "run_id": RUN}, None)))
        await writer.drain()
        deadline = asyncio.get_running_loop().time() + WITHIN_S
        while not server.core.workers[0].joined:
            assert asyncio.get_running_loop().time() < deadline, "worker 0 never joined"
            await asyncio.sleep(0.02)
        writer.close()
        await asyncio.wait_for(reader.read(), WITHIN_S)
        client = HttpTransport(server.url, server.core.store.numel, timeout_s=WITHIN_S)
        try:
            await client.request("join", {"worker": 1, "run_id": RUN})
        finally:
            await client.close()
        await still_serves(server)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    lines = disconnect_lines(caplog)
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "left" in lines[0].getMessage()
