"""HTTP framing a hostile client can send beside a well-formed frame: content encodings
aiohttp decodes for us, chunked bodies, lying lengths. Each gets a 4xx with a reason (or a
clean close), never a 5xx or a traceback; the model stays exactly as it was, and the
server serves a well-formed push afterwards."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator

import pytest
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import PATH as STREAM_PATH
from asyncsync.transport.frame_stream import REQUEST, UPGRADE
from asyncsync.transport.http_server import HTTP_LOG, ParameterServer
from asyncsync.transport.log_filters import PeerErrorFilter, RepeatFilter
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "framing"
WITHIN_S = 30.0
"""How long a reply may take (it takes milliseconds)."""


def frame(header: dict[str, object], tensor: torch.Tensor | None = None) -> bytes:
    data = encode_header(header, tensor)
    if tensor is not None:
        data += b"".join(bytes(piece) for piece in tensor_chunks(tensor))
    return data


def request(op: str, body: bytes, *fields: bytes, length: bool = True) -> bytes:
    """A raw POST of `body` to `op` with extra header `fields` (and a Content-Length)."""
    head = [f"POST /v1/{op} HTTP/1.1", "Host: x", f"Content-Type: {CONTENT_TYPE}",
            "Connection: close"]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return "\r\n".join(head).encode() + b"\r\n" + b"".join(f + b"\r\n" for f in fields) \
        + b"\r\n" + body


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def exchange(port: int, data: bytes) -> tuple[int, bytes]:
    """Send `data` on a new connection; the reply's status and body (0: closed unanswered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), WITHIN_S)
    finally:
        writer.close()
    if not reply:
        return 0, b""
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.fixture(autouse=True)
def fresh_log_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rate limit starts afresh (another test's line of the same kind is not held)."""
    monkeypatch.setattr(HTTP_LOG, "filters", [RepeatFilter(), PeerErrorFilter()])


@pytest.fixture
async def joined() -> AsyncIterator[tuple[ParameterServer, bytes]]:
    """A server whose worker 0 has joined, and a well-formed push of that worker."""
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        status, body = await exchange(server.port, request("join", frame(
            {"worker": 0, "run_id": RUN})))
        assert status == 200, body
        (size,) = PREFIX.unpack(body[:PREFIX.size])
        secret = decode_header(body[PREFIX.size:PREFIX.size + size])["meta"]["session"]
        push = frame({"worker": 0, "run_id": RUN, "base_version": 0, "kind": "gradient",
                      "steps": 1, "samples": 4, "session": secret},
                     torch.full((server.core.store.numel,), 0.01))
        yield server, push


def hostile(push: bytes) -> dict[str, bytes]:
    """Requests whose HTTP framing is broken (the frame inside may be fine)."""
    gzip_push = gzip.compress(push)
    return {
        "gzip body that is not gzip": request(
            "push", b"\x1f\x8b" + b"not gzip" * 20, b"Content-Encoding: gzip"),
        "deflate body that is not deflate": request(
            "push", b"not deflate" * 20, b"Content-Encoding: deflate"),
        "a gzip body cut short": request(
            "push", gzip_push[:len(gzip_push) // 2], b"Content-Encoding: gzip"),
        "gzip garbage in chunks": request(
            "push", chunked(b"hello", b"world"), b"Content-Encoding: gzip",
            b"Transfer-Encoding: chunked", length=False),
        "a good chunk, then a bad chunk size": request(
            "push", b"%x\r\n%s\r\nzz\r\n" % (16, push[:16]), b"Transfer-Encoding: chunked",
            length=False),
        "Content-Length and chunked both": request(
            "push", chunked(push), b"Transfer-Encoding: chunked"),
        "two Content-Lengths": request(
            "push", push, b"Content-Length: 7", length=True),
        "a negative Content-Length": request(
            "push", push, b"Content-Length: -5", length=False),
        "a Content-Length past 64 bits": request(
            "push", push, b"Content-Length: 99999999999999999999999", length=False),
        "a Content-Length shorter than the body": request(
            "push", push, b"Content-Length: 10", length=False),
    }


async def test_broken_http_framing_gets_a_4xx_and_changes_nothing(
    joined: tuple[ParameterServer, bytes], caplog: pytest.LogCaptureFixture,
) -> None:
    server, push = joined
    before = server.core.store.w.clone()
    with caplog.at_level(logging.INFO):
        for name, data in hostile(push).items():
            status, reason = await exchange(server.port, data)
            assert 400 <= status < 500, f"{name}: {status} {reason[:200]!r}"
            assert reason.strip(), f"{name}: a {status} without a reason"
            assert server.core.store.version == 0, name
            assert torch.equal(server.core.store.w, before), name
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert not [r for r in caplog.records if "Unhandled" in r.getMessage()]
    status, _ = await exchange(server.port, request("push", push))
    assert status == 200
    assert server.core.store.version == 1


async def test_an_undecodable_body_is_refused_with_what_could_not_be_decoded(
    joined: tuple[ParameterServer, bytes],
) -> None:
    server, _ = joined
    status, reason = await exchange(server.port, request(
        "push", b"\x1f\x8b" + b"not gzip" * 20, b"Content-Encoding: gzip"))
    assert status == 400
    assert b"gzip" in reason and b"\n" not in reason.strip()


@pytest.mark.parametrize("encode", [gzip.compress, zlib.compress], ids=["gzip", "deflate"])
async def test_a_well_formed_push_in_a_content_encoding_is_applied(
    joined: tuple[ParameterServer, bytes], encode: object,
) -> None:
    """(The encodings aiohttp decodes are a client's right; they only must not be a way
    to a 5xx.)"""
    server, push = joined
    assert callable(encode)
    name = b"gzip" if encode is gzip.compress else b"deflate"
    status, _ = await exchange(server.port, request("push", encode(push),
                                                    b"Content-Encoding: " + name))
    assert status == 200
    assert server.core.store.version == 1


async def test_a_stream_client_that_dies_mid_tensor_changes_nothing(
    joined: tuple[ParameterServer, bytes], caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker killed while its push's tensor is on the wire (the stream channel receives
    it straight into a vector): nothing is applied, nothing is logged as an error, and the
    server serves the next worker."""
    server, push = joined
    before = server.core.store.w.clone()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"POST {STREAM_PATH} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                 f"Upgrade: {UPGRADE}\r\nContent-Length: 0\r\n\r\n".encode())
    assert b" 101 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
    with caplog.at_level(logging.INFO):
        writer.write(REQUEST.pack(4, len(push)) + b"push" + push[:len(push) - 40])
        await writer.drain()
        await asyncio.sleep(0.2)  # the server is receiving the tensor
        writer.transport.abort()  # killed: a reset, not an orderly close
        for _ in range(200):
            if server.gate.open == 0:
                break
            await asyncio.sleep(0.02)
    assert server.gate.open == 0
    assert server.core.store.version == 0 and torch.equal(server.core.store.w, before)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    status, _ = await exchange(server.port, request("push", push))
    assert status == 200 and server.core.store.version == 1
