"""Connection limits of the HTTP server: time to send a request head, idle keep-alive time,
connections in total and per peer address, and rate-limited log lines. Stalled or idle
connections are cut, and a flood of half-sent request heads cannot lock out a request."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from asyncsync.clock import now
from asyncsync.study.launch import TOKEN_ENV
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model

HALF_HEAD = b"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Ty"
"""A request head cut off mid-line, without a token."""
CLOSED_WITHIN_S = 30.0
"""How long a connection the server must close may take to read as closed (generous: the
limits under test are far shorter)."""


def status_request() -> bytes:
    body = encode_header({}, None)
    return (b"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Type: " + CONTENT_TYPE.encode()
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP response: its status line, headers and Content-Length body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSED_WITHIN_S)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (reads to EOF) within `CLOSED_WITHIN_S`."""
    try:
        await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


async def half_heads(port: int, count: int, source: str,
                     ) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` connections from `source` that each send half a request head and stall."""
    streams = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(source, 0))
        writer.write(HALF_HEAD)
        await writer.drain()
        streams.append((reader, writer))
    return streams


async def until(ready: Callable[[], bool], what: str) -> None:
    """Poll `ready()` until it is true, for `CLOSED_WITHIN_S` at most."""
    deadline = now() + CLOSED_WITHIN_S
    while not ready():
        assert now() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[ParameterServer]:
    limits: ConnectionLimits = getattr(request, "param", ConnectionLimits())
    async with ParameterServer(tiny_model(), "asp", 1, connections=limits) as live:
        yield live


def test_limits_must_be_positive() -> None:
    for name in ("header_timeout_s", "keepalive_s", "max_connections", "max_per_peer",
                 "min_body_bytes_per_s"):
        with pytest.raises(ValueError, match=name):
            ConnectionLimits(**{name: 0})


@pytest.mark.parametrize("server", [ConnectionLimits(header_timeout_s=0.3)], indirect=True)
async def test_a_stalled_request_head_is_cut_after_the_header_timeout(
    server: ParameterServer,
) -> None:
    stalled = await half_heads(server.port, 1, "127.0.0.1")
    silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await closed_by_server(stalled[0][0])
    assert await closed_by_server(silent_reader)  # a connection that never says anything
    assert server.gate.timed_out == 2 and server.gate.open == 0
    for _, writer in [*stalled, (silent_reader, silent_writer)]:
        writer.close()


@pytest.mark.parametrize("server", [ConnectionLimits(header_timeout_s=0.3,
                                                     min_body_bytes_per_s=1)], indirect=True)
async def test_a_request_in_progress_is_not_cut_by_the_header_timeout(
    server: ParameterServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    request = status_request()
    writer.write(request[:-1])  # the whole head, the body but its last byte
    await writer.drain()
    await asyncio.sleep(1.0)  # over three header timeouts, inside the request
    assert server.gate.timed_out == 0 and server.gate.open == 1
    writer.write(request[-1:])
    assert (await read_response(reader)).startswith(b"HTTP/1.1 200")
    writer.close()


@pytest.mark.parametrize("server", [ConnectionLimits(keepalive_s=0.3)], indirect=True)
async def test_an_idle_keep_alive_connection_is_closed(server: ParameterServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(status_request())
    assert (await read_response(reader)).startswith(b"HTTP/1.1 200")
    assert await closed_by_server(reader)
    assert server.gate.timed_out == 0  # the keep-alive timer closed it, not the head's
    writer.close()


@pytest.mark.parametrize("server", [ConnectionLimits(max_per_peer=8),
                                    ConnectionLimits(max_connections=8)], indirect=True)
async def test_stalled_heads_over_a_limit_make_room_for_new_connections(
    server: ParameterServer,
) -> None:
    """The peer's (or the server's) limit is 8: each later stalled head closes the oldest,
    and a real request from the same address still gets through."""
    stalled = await half_heads(server.port, 20, "127.0.0.2")
    await until(lambda: server.gate.evicted == 12, "12 stalled heads are closed")
    for reader, _ in stalled[:12]:  # the oldest went first
        assert await closed_by_server(reader)
    assert server.gate.open == 8 and server.gate.refused == 0
    client = HttpTransport(server.url, 0, local_addr="127.0.0.2", timeout_s=CLOSED_WITHIN_S)
    reply, _ = await client.request("status", {})
    await client.close()
    assert "workers" in reply
    assert server.gate.evicted == 13
    for _, writer in stalled:
        writer.close()


@pytest.mark.parametrize("server", [ConnectionLimits(max_per_peer=1)], indirect=True)
async def test_a_busy_server_answers_503_and_the_client_retries(
    server: ParameterServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(status_request()[:-1])  # inside a request until its last byte
    await writer.drain()
    await until(lambda: server.gate.open == 1, "the first connection is admitted")
    client = HttpTransport(server.url, 0, connect_timeout_s=CLOSED_WITHIN_S)
    request = asyncio.ensure_future(client.request("status", {}))
    await until(lambda: server.gate.refused >= 1, "a second connection is refused")
    assert not request.done()
    writer.write(status_request()[-1:])  # answered, the first connection gives way
    assert (await read_response(reader)).startswith(b"HTTP/1.1 200")
    reply, _ = await asyncio.wait_for(request, CLOSED_WITHIN_S)
    writer.close()
    await client.close()
    assert "workers" in reply


async def test_repeated_log_lines_are_rate_limited(server: ParameterServer,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Malformed requests: at most one line a second per kind, the rest counted; a line,
    never a traceback, per malformed request."""
    sent = 30
    began = now()
    with caplog.at_level(logging.DEBUG):
        for _ in range(sent):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)).startswith(
                b"HTTP/1.0 400")
            writer.close()
        elapsed = now() - began
        await asyncio.sleep(1.1)  # then one more: it is logged with the count held back
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
        writer.close()
    lines = [r for r in caplog.records if "Error handling request" in r.getMessage()]
    assert 2 <= len(lines) <= elapsed + 2, len(lines)
    assert all(r.exc_info is None and "Content-Length" in r.getMessage() for r in lines)
    held = sum(int(r.getMessage().split(" more like this held back")[0].rsplit("(", 1)[1])
               for r in lines if "held back" in r.getMessage())
    assert len(lines) + held >= sent + 1  # (more if an earlier test's lines were held)


def test_half_sent_heads_do_not_lock_out_an_authorised_request(tmp_path: Path) -> None:
    """A server with a file-descriptor limit of 200 (the CLI, as a user starts it): 200
    connections from one address that each stall in their request head, then a request
    with the token from the same address gets its answer."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('[defaults]\nworkers = 1\n[defaults.model]\nname = "mlp"\n'
                      '[defaults.stop]\ntime_s = 600\n[[runs]]\nname = "r"\nprotocol = "asp"\n')
    port_file = tmp_path / "port"
    server = subprocess.Popen(
        ["sh", "-c", 'ulimit -Sn 200 && exec "$@"', "sh", sys.executable, "-m", "asyncsync",
         "server", "--recipe", str(recipe), "--run-id", "lockout", "--port", "0",
         "--port-file", str(port_file)],
        env={**os.environ, TOKEN_ENV: "run-token", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    async def attack(port: int) -> None:
        stalled = await half_heads(port, 200, "127.0.0.1")
        client = HttpTransport(f"http://127.0.0.1:{port}", 0, token="run-token",
                               timeout_s=CLOSED_WITHIN_S)
        try:
            reply, _ = await client.request("status", {})
            assert "workers" in reply
            await client.request("stop", {"run_id": "lockout"})
        finally:
            await client.close()
            for _, writer in stalled:
                writer.close()

    try:
        deadline = time.monotonic() + 120.0
        while not (port_file.exists() and port_file.read_text()):
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        asyncio.run(attack(int(port_file.read_text())))
        out, _ = server.communicate(timeout=60)
        assert server.returncode == 0, out
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
