"""The stream channel's framing at its edges (session 12's mutation testing found them
unguarded): the op name's length limits, a frame read no further than its declared
length, and a client's reading of a server's answer to the upgrade."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgpack
import pytest
import torch

from asyncsync.clock import now
from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import (
    CLIENT_IDLE_S,
    REQUEST,
    StreamConnection,
    StreamRefused,
)
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import PREFIX, decode_header
from tests.helpers import tiny_model

pytestmark = pytest.mark.timeout(120)
RUN = "codecmut"
WITHIN_S = 10.0
"""Far less than the server's keep-alive: a reply that does not come by then never will."""


def frame(header: dict[str, object], tensor: bytes = b"") -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(len(packed)) + packed + tensor


async def pieces(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def reply(stream: StreamConnection) -> tuple[int, bytes]:
    status, length = await asyncio.wait_for(stream.reply(), WITHIN_S)
    return status, await stream.receiver.read_exactly(length)


async def test_an_op_name_of_32_bytes_is_read_and_one_of_0_or_33_ends_the_stream() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        data = frame({"run_id": RUN})
        stream = await StreamConnection.open(server.url, None, None, None)
        await stream.send("x" * 32, len(data), pieces(data))  # read whole, then refused
        status, text = await reply(stream)
        assert (status, b"unknown operation" in text) == (404, True)
        await stream.send("status", len(data), pieces(data))  # the same stream goes on
        assert (await reply(stream))[0] == 200
        for name, size in (("", 0), ("x" * 33, 33)):
            stream = await StreamConnection.open(server.url, None, None, None)
            await stream.send(name, len(data), pieces(data))
            status, text = await reply(stream)
            assert status == 400 and f"op name of {size} bytes (1 to 32)" in text.decode()
            assert await stream.receiver.read_some(1) == b""  # closed


async def test_frames_sent_back_to_back_are_each_read_to_their_own_end() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        data = frame({"run_id": RUN})
        one = REQUEST.pack(6, len(data)) + b"status" + data
        stream = await StreamConnection.open(server.url, None, None, None)
        stream.receiver.write(one + one)  # the second before the first is answered
        assert (await reply(stream))[0] == 200
        assert (await reply(stream))[0] == 200


async def test_a_tensor_longer_than_its_frame_is_refused_without_waiting_for_more() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        numel = server.core.store.numel
        stream = await StreamConnection.open(server.url, None, None, None)
        joined = frame({"worker": 0, "run_id": RUN})
        await stream.send("join", len(joined), pieces(joined))
        status, text = await reply(stream)
        (size,) = PREFIX.unpack(text[: PREFIX.size])
        secret = decode_header(text[PREFIX.size : PREFIX.size + size])["meta"]["session"]
        assert status == 200
        # The header promises numel floats; the frame declares 8 bytes fewer, and the
        # client sends just the frame, then waits for the answer.
        push = frame({"worker": 0, "run_id": RUN, "session": secret, "base_version": 0,
                      "kind": "gradient", "seq": 1, "steps": 1, "samples": 1,
                      "tensor": {"dtype": "float32", "shape": [numel]}},
                     torch.zeros(numel).numpy().tobytes())[:-8]
        await stream.send("push", len(push), pieces(push))
        status, text = await reply(stream)
        assert (status, b"truncated" in text) == (400, True)
        assert server.core.store.version == 0


async def test_a_client_gives_up_on_an_upgrade_answer_with_no_end_of_head() -> None:
    """A peer answering with an endless head (no blank line) is left after 64 KiB, not
    read for ever."""
    async def endless(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nX-Pad: " + b"a" * 100_000)
        await writer.drain()
        await asyncio.sleep(3 * WITHIN_S)  # and stays connected
        writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionError, match="no upgrade from"):
            await asyncio.wait_for(StreamConnection.open(f"http://127.0.0.1:{port}", None,
                                                         None, None), WITHIN_S)
    finally:
        server.close()


async def test_closing_the_server_ends_its_open_streams_at_once() -> None:
    server = ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN))
    await server.__aenter__()
    stream = await StreamConnection.open(server.url, None, None, None)
    data = frame({"run_id": RUN})
    await stream.send("status", len(data), pieces(data))
    assert (await reply(stream))[0] == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(server.__aexit__(None, None, None), WITHIN_S)
    assert await asyncio.wait_for(stream.receiver.read_some(1), WITHIN_S) == b""
    assert loop.time() - started < 2.0  # not after a keep-alive or shutdown timeout


async def test_a_client_does_not_reuse_a_stream_idle_for_its_limit() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        stream = await StreamConnection.open(server.url, None, None, None)
        stream.idle_since = now() - (CLIENT_IDLE_S - 1.0)
        assert stream.reusable
        stream.idle_since = now() - CLIENT_IDLE_S
        assert not stream.reusable  # the server may be closing it
        stream.close()


async def test_a_frame_of_exactly_its_ops_body_limit_is_answered() -> None:
    """A status frame may be a prefix and a 64 KiB header: 4 + 65536 bytes, no more."""
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        header = {"run_id": RUN, "pad": "x" * (65536 - 24)}  # 1 + (7 + 9) + (4 + 3)
        for extra, status in ((0, 200), (1, 413)):
            data = frame({**header, "pad": header["pad"] + "x" * extra})
            assert len(data) == 4 + 65536 + extra
            stream = await StreamConnection.open(server.url, None, None, None)
            await stream.send("status", len(data), pieces(data))
            assert (await reply(stream))[0] == status
            stream.close()


async def test_a_refused_upgrade_says_why_in_full() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN),
                               token="run-token") as server:
        with pytest.raises(StreamRefused) as err:
            await StreamConnection.open(server.url, None, None, None)
        assert (err.value.status, err.value.reason) == (401, "missing or wrong bearer token")
