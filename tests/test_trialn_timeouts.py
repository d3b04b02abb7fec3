"""A client's request to a server that accepts the connection but never answers (a
stopped process: Ctrl-Z, SIGSTOP; a black hole) ends after the transport's `timeout_s`
with a `ConnectionError` that says so, on either channel, instead of waiting forever (the
stream channel had no bound) or ending with a bare `TimeoutError` (the HTTP channel: the
command line then printed an empty ``error:`` line)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from asyncsync.transport.http_client import HttpTransport

GUARD_S = 60.0
"""How long the test waits for the bounded request (far over its 0.5 s bound)."""


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """The URL of a listener that reads whatever comes and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("channel", ["stream", "http"])
async def test_a_server_that_never_answers_ends_the_request(silent_server: str,
                                                            channel: str) -> None:
    client = HttpTransport(silent_server, numel=0, timeout_s=0.5, connect_timeout_s=0.0,
                           channel=channel)
    try:
        with pytest.raises(ConnectionError) as raised:
            await asyncio.wait_for(client.request("status", {}), GUARD_S)
    finally:
        await client.close()
    message = str(raised.value)
    assert "no answer" in message and silent_server in message and "0.5 s" in message
