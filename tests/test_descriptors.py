"""A server whose file-descriptor limit is low never runs out of descriptors: a burst of
connections larger than it may hold is shed by the connection gate, never by a failed
accept."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import selectors
import socket
import subprocess
import sys
import time
from typing import cast

from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.log_filters import AcceptFailureFilter
from tests.test_connections import CLOSED_WITHIN_S, HALF_HEAD

SERVER = """
import asyncio, logging, resource, sys
from asyncsync.transport.http_server import ParameterServer
from tests.helpers import tiny_model

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logging.basicConfig(level=logging.INFO, stream=sys.stderr)

async def main() -> None:
    async with ParameterServer(tiny_model(), "asp", 1) as server:
        print(server.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""
BURST = 300
"""Half-sent request heads at once, more than the server may hold (256 descriptors)."""


def burst(port: int) -> list[socket.socket]:
    """`BURST` connections opened at once (faster than the server's loop takes them), each
    sending half a request head once it is connected."""
    stalled = []
    with selectors.DefaultSelector() as selector:
        for _ in range(BURST):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            selector.register(sock, selectors.EVENT_WRITE)
            stalled.append(sock)
        deadline = time.monotonic() + CLOSED_WITHIN_S
        while selector.get_map():
            assert time.monotonic() < deadline, "the connections were not accepted"
            for key, _ in selector.select(timeout=1.0):
                sock = cast(socket.socket, key.fileobj)
                selector.unregister(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    sock.send(HALF_HEAD)
    return stalled


async def ask(port: int) -> None:
    """A request that must be answered."""
    client = HttpTransport(f"http://127.0.0.1:{port}", 0, timeout_s=CLOSED_WITHIN_S)
    try:
        reply, _ = await client.request("status", {})
    finally:
        await client.close()
    assert "workers" in reply


def test_a_burst_of_half_sent_heads_never_exhausts_descriptors() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        for _ in range(3):
            stalled = burst(port)
            asyncio.run(ask(port))
            for sock in stalled:
                sock.close()
        _, log = server.communicate("", timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, log
    assert "Too many open files" not in log and "out of system resource" not in log, log


def test_a_failed_accept_is_one_rate_limited_line() -> None:
    """asyncio's line for a failed accept: one line with the error, the next held back."""
    assert any(isinstance(f, AcceptFailureFilter) for f in logging.getLogger("asyncio").filters)
    accept_filter = AcceptFailureFilter(interval_s=3600.0)
    records = []
    for fd in (6, 7):
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError:
            record = logging.LogRecord(
                "asyncio", logging.ERROR, __file__, 1,
                f"socket.accept() out of system resource\nsocket: <TransportSocket fd={fd}>",
                None, sys.exc_info())
        records.append(record)
    first, second = (accept_filter.filter(record) for record in records)
    assert first and not second
    assert records[0].exc_info is None and "\n" not in records[0].getMessage()
    assert "Too many open files" in records[0].getMessage()
