"""The stream channel (`asyncsync.transport.frame_stream`): the same answers as HTTP,
hostile frames refused with the model untouched, tokens, idle streams, and the choice
between the stream and a POST per request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import Forbidden, OutOfStep
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import resolve
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.frame_stream import (
    BUFFER_BYTES,
    REPLY,
    REQUEST,
    StreamConnection,
    StreamRefused,
    _Receiver,
)
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.tokens import worker_token
from asyncsync.wire.frames import PREFIX, decode_header, encode_header
from tests.helpers import tiny_model
from tests.test_http_hostile import RUN, SESSION, body, cases, push_header, raw_header

pytestmark = pytest.mark.timeout(120)


async def pieces(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def exchange(stream: StreamConnection, op: str, data: bytes) -> tuple[int, bytes]:
    """One request on `stream`: the reply's status and body."""
    await stream.send(op, len(data), pieces(data))
    status, length = await stream.reply()
    return status, await stream.receiver.read_exactly(length)


async def join(stream: StreamConnection) -> None:
    """Join as worker 0 and keep its session secret for `push_header`."""
    status, reply = await exchange(stream, "join", body({"worker": 0, "run_id": RUN}))
    assert status == 200
    (size,) = PREFIX.unpack(reply[:PREFIX.size])
    header = decode_header(reply[PREFIX.size:PREFIX.size + size])
    SESSION["secret"] = header["meta"]["session"]


async def test_every_bad_frame_is_refused_and_changes_nothing() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        numel = server.core.store.numel
        stream = await StreamConnection.open(server.url, None, None, None)
        await join(stream)
        before = server.core.store.w.clone()
        checked = 0
        for name, op, data, _, status, reason in cases(numel):
            if name == "wrong content type":  # the stream has no content type
                continue
            stream = await StreamConnection.open(server.url, None, None, None)
            got, text = await exchange(stream, op, data)
            stream.close()
            assert got == status, f"{name}: got {got} {text!r}"
            assert reason in text.decode(), f"{name}: reason {text!r} lacks {reason!r}"
            assert b"\n" not in text.strip(), name
            assert server.core.store.version == 0, name
            assert torch.equal(server.core.store.w, before), name
            checked += 1
        assert checked == len(cases(numel)) - 1
        assert server.core.workers[0].nonfinite == 4  # the NaN, NaN-scale and two Inf pushes
        stream = await StreamConnection.open(server.url, None, None, None)
        got, _ = await exchange(stream, "push", body(push_header(), torch.full((numel,), 0.01)))
        assert got == 200
        assert server.core.store.version == 1


async def test_a_refused_frame_read_whole_keeps_the_stream_one_refused_early_ends_it() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        numel = server.core.store.numel
        stream = await StreamConnection.open(server.url, None, None, None)
        await join(stream)
        good = torch.full((numel,), 0.01)
        got, text = await exchange(stream, "push", body(push_header(base_version=5), good))
        assert (got, b"ahead" in text) == (409, True)
        got, _ = await exchange(stream, "push", body(push_header(), good))  # same stream
        assert got == 200 and server.core.store.version == 1
        data = body(push_header(base_version=1), good)[:-9]  # a short tensor, read whole
        got, text = await exchange(stream, "push", data)
        assert (got, b"truncated" in text) == (400, True)
        head = raw_header(b"\xc1")  # refused before the declared tensor bytes arrive
        await stream.send("push", len(head) + 4 * numel, pieces(head))
        got, length = await stream.reply()
        assert (got, b"malformed" in await stream.receiver.read_exactly(length)) == (400, True)
        assert await stream.receiver.read_some(1) == b""  # next frame's start unknown: closed
        assert server.core.store.version == 1


async def test_an_oversized_declared_body_is_refused_before_it_is_read() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        stream = await StreamConnection.open(server.url, None, None, None)
        await stream.send("push", 1 << 40, pieces(b""))
        status, length = await stream.reply()
        assert status == 413
        assert b"exceeds" in await stream.receiver.read_exactly(length)
        assert await stream.receiver.read_some(1) == b""


async def test_the_upgrade_needs_the_token_and_a_worker_token_cannot_stop() -> None:
    token = "run-token"
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN),
                               token=token) as server:
        with pytest.raises(StreamRefused) as refused:
            await StreamConnection.open(server.url, None, None, None)
        assert refused.value.status == 401
        with pytest.raises(StreamRefused):
            await StreamConnection.open(server.url, "wrong", None, None)
        worker = HttpTransport(server.url, server.core.store.numel,
                               token=worker_token(token))
        reply, _ = await worker.request("join", {"worker": 0, "run_id": RUN})
        assert reply["version"] == 0
        with pytest.raises(Forbidden, match="run token"):
            await worker.request("stop", {"run_id": RUN})
        assert not server.core.store.stopping
        await worker.close()
        admin = HttpTransport(server.url, server.core.store.numel, token=token)
        await admin.request("stop", {"run_id": RUN})
        assert server.core.store.stopping
        await admin.close()


@pytest.mark.parametrize("stall", ["between frames", "mid-frame"])
async def test_an_idle_stream_is_closed_and_the_gate_forgets_it(stall: str) -> None:
    limits = ConnectionLimits(keepalive_s=0.3)
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN),
                               connections=limits) as server:
        stream = await StreamConnection.open(server.url, None, None, None)
        await join(stream)
        assert server.gate.open == 1
        if stall == "mid-frame":  # declares more than it sends
            data = body(push_header(), torch.zeros(server.core.store.numel))
            await stream.send("push", len(data), pieces(data[:100]))
        assert await asyncio.wait_for(stream.receiver.read_some(1), 5) == b""
        for _ in range(100):
            if server.gate.open == 0:
                break
            await asyncio.sleep(0.02)
        assert server.gate.open == 0
        assert server.core.store.version == 0


async def test_requests_reuse_one_stream_and_answer_as_over_http() -> None:
    replies = []
    for channel in ("stream", "http"):
        async with ParameterServer(tiny_model(), "asp", 1,
                                   ServerSettings(run_id=RUN)) as server:
            transport = HttpTransport(server.url, server.core.store.numel, channel=channel)
            reply, vector = await transport.request("join", {"worker": 0, "run_id": RUN})
            session = reply["meta"]["session"]
            for _ in range(3):
                reply, vector = await transport.request(
                    "pull", {"worker": 0, "run_id": RUN, "session": session,
                             "base_version": 0})
                replies.append((reply["version"], vector))
            assert len(transport._streams) == (1 if channel == "stream" else 0)
            with pytest.raises(OutOfStep):  # a refusal comes back as the SDK's class
                await transport.request(  # (a wrong secret: none would take the rank over)
                    "join", {"worker": 0, "run_id": RUN, "session": "guess"})
            await transport.close()
            assert server.gate.refused == 0
    assert all(torch.equal(v, replies[0][1]) for _, v in replies)


@pytest.mark.parametrize("answer", [404, 415, 400])
async def test_a_server_without_the_stream_is_asked_over_http(answer: int) -> None:
    """A server that reads /v1/stream as an unknown path (404) or as an op (an older
    asyncsync server: 415 or 400) gets each request as a POST."""

    async def older_server(request: web.Request) -> web.Response:
        if request.match_info.get("op", "join") != "join":
            return web.Response(status=answer, text="not an op here")
        return web.Response(body=encode_header({"version": 7}, None),
                            content_type="application/x-asyncsync")

    app = web.Application()
    app.router.add_post("/v1/join" if answer == 404 else "/v1/{op}", older_server)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        transport = HttpTransport(f"http://127.0.0.1:{runner.addresses[0][1]}", 4)
        reply, _ = await transport.request("join", {})
        assert reply == {"version": 7}
        assert transport.channel == "http"
        await transport.close()
    finally:
        await runner.cleanup()


async def test_the_stream_is_the_default_and_a_post_each_can_be_chosen() -> None:
    default = HttpTransport("http://127.0.0.1:1", 12_000_000)
    posting = HttpTransport("http://127.0.0.1:1", 12_000_000, channel="http")
    assert (default.channel, posting.channel) == ("stream", "http")
    with pytest.raises(ValueError, match="channel"):
        HttpTransport("http://127.0.0.1:1", 4, channel="auto")
    for transport in (default, posting):
        await transport.close()


def test_the_recipe_chooses_the_channel() -> None:
    def channel(defaults: dict[str, object]) -> str:
        return resolve({"defaults": defaults, "runs": [{"name": "a", "protocol": "bsp"}]},
                       "r").runs[0].network.channel

    assert channel({"network": {"channel": "http"}}) == "http"
    assert channel({}) == "stream"
    with pytest.raises(ConfigError, match="channel"):
        channel({"network": {"channel": "carrier-pigeon"}})


async def test_odd_upgrade_requests_get_no_5xx_and_change_nothing() -> None:
    base = b"POST /v1/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
    requests = {
        b"101": [base + b"Content-Length: 5\r\n\r\nhello",
                 base + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        b"400": [b"POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                 base.replace(b"Upgrade: tcp", b"Upgrade: websocket")
                 + b"Content-Length: 0\r\n\r\n"],
        b"404": [b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                 b"Upgrade: tcp\r\n\r\n"],
    }
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        before = server.core.store.w.clone()
        for status, raws in requests.items():
            for raw in raws:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(raw)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.split(b" ")[1] == status, raw
                if status == b"101":  # a frame prefix with a 255-byte op: refused, closed
                    writer.write(b"\xff" * 12)
                    got, length = REPLY.unpack(await reader.readexactly(REPLY.size))
                    assert got == 400 and b"op name" in await reader.readexactly(length)
                    assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
        assert server.core.store.version == 0
        assert torch.equal(server.core.store.w, before)


def wide_model() -> torch.nn.Module:
    """About 2.6 MB of parameters: a reply spans many socket reads and wire chunks."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(400, 1600), torch.nn.Linear(1600, 2))


async def test_a_large_reply_is_received_whole_into_the_vector() -> None:
    async with ParameterServer(wide_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        numel = server.core.store.numel
        assert 4 * numel > 2 * (1 << 20)
        transport = HttpTransport(server.url, numel, channel="stream")
        reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN})
        header = {"worker": 0, "run_id": RUN, "session": reply["meta"]["session"],
                  "base_version": 0}
        for _ in range(2):  # the second reuses the stream and a warm vector
            _, vector = await transport.request("pull", header)
            assert vector is not None and torch.equal(vector, server.core.store.w)
        assert len(transport._streams) == 1
        await transport.close()


async def test_a_reply_cut_short_raises_connection_error() -> None:
    """A server that declares a reply and closes half way: the client raises, not hangs."""

    async def half_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\n"
                     b"Connection: Upgrade\r\n\r\n")
        await reader.readexactly(REQUEST.size)  # then the op and body, ignored
        head = encode_header({"version": 0}, torch.zeros(100_000))
        writer.write(REPLY.pack(200, len(head) + 400_000) + head + bytes(150_000))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(half_reply, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = HttpTransport(f"http://127.0.0.1:{port}", 100_000, channel="stream")
    with pytest.raises(ConnectionError, match="pull"):
        await asyncio.wait_for(transport.request("pull", {"worker": 0}), 10)
    await transport.close()
    server.close()


class FakeTransport(asyncio.Transport):
    """Records whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False


def deliver(receiver: _Receiver, data: bytes) -> None:
    """What the event loop does with bytes from the socket."""
    while data:
        buffer = receiver.get_buffer(-1)
        n = min(len(buffer), len(data))
        buffer[:n] = data[:n]
        receiver.buffer_updated(n)
        data = data[n:]


async def test_a_receiver_pauses_reading_when_full_and_resumes_when_it_waits() -> None:
    """Reading pauses while more than BUFFER_BYTES wait unread; a reader that then wants
    more resumes it, however the unread bytes were taken (here into a view)."""
    receiver, transport = _Receiver(), FakeTransport()
    receiver.connection_made(transport)
    data = bytes(range(256)) * (BUFFER_BYTES // 128)
    deliver(receiver, data)
    assert not transport.reading
    view = memoryview(bytearray(len(data)))
    assert await receiver.read_into(view) == len(data) and view == data
    more = asyncio.ensure_future(receiver.read_exactly(3))
    await asyncio.sleep(0)
    assert transport.reading, "a reader waits: reading must go on"
    deliver(receiver, b"abc")
    assert await asyncio.wait_for(more, 1) == b"abc"
