"""A worker given ``http://`` for a server that serves https (or any URL whose listener
closes the connection without answering) stops at once with an error that says so,
instead of retrying for `connect_timeout_s` and then claiming it "cannot reach" a server
it reached. A server that has answered before and then closes a new connection
unanswered (one shutting down or restarting) is still retried."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer, server_tls
from tests.helpers import tiny_model

OPENSSL = shutil.which("openssl")
CONNECT_S = 20.0
"""The client's retry window: the old behaviour ran it out, the new one ends at once."""


@pytest.fixture
async def closing_listener() -> AsyncIterator[str]:
    """The URL of a listener that closes every connection without a byte."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_listener_that_hangs_up_is_named_at_once(closing_listener: str) -> None:
    client = HttpTransport(closing_listener, numel=0, connect_timeout_s=CONNECT_S)
    try:
        with pytest.raises(ConnectionError, match="closed the connection without answering"):
            await asyncio.wait_for(client.request("join", {}), CONNECT_S / 2)
    finally:
        await client.close()


@pytest.mark.skipif(OPENSSL is None, reason="needs openssl to make a certificate")
async def test_http_to_an_https_server_says_to_give_https(tmp_path: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-keyout",
                    str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem"), "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    tls = server_tls(tmp_path / "c.pem", tmp_path / "k.pem")
    async with ParameterServer(tiny_model(), "asp", 1, tls=tls) as server:
        client = HttpTransport(server.url.replace("https://", "http://"),
                               server.core.store.numel, connect_timeout_s=CONNECT_S)
        try:
            with pytest.raises(ConnectionError, match="https://"):
                await asyncio.wait_for(client.request("join", {"worker": 0, "run_id": "run"}),
                                       CONNECT_S / 2)
        finally:
            await client.close()
        assert not server.core.workers[0].joined


async def test_a_server_that_answered_before_is_retried() -> None:
    async with ParameterServer(tiny_model(), "asp", 1) as server:
        client = HttpTransport(server.url, server.core.store.numel, connect_timeout_s=0.0)
        try:
            status, _ = await client.request("status", {})
            assert status["protocol"] == "asp"
        finally:
            await client.close()
    listener = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", server.port)
    try:
        with pytest.raises(ConnectionError, match="cannot reach"):  # retried, then given up
            await client.request("status", {})
    finally:
        await client.close()
        listener.close()
        await listener.wait_closed()
