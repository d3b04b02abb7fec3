"""The stream channel: one HTTP request upgrades a connection to a stream of frames.

A worker's client opens a connection, sends ``POST /v1/stream`` with ``Connection:
Upgrade`` and ``Upgrade: tcp`` (and its bearer token), and once answered ``101 Switching
Protocols`` (not before: bytes sent with the upgrade's head are not part of the stream)
sends its requests on that connection one after another::

    request:  uint8 op length L, uint64 body length B (big-endian), L bytes of op (ASCII),
              B bytes: the same frame an HTTP POST to /v1/{op} carries
    reply:    uint16 status, uint64 body length B, then B bytes: a frame (status 200) or
              the one-line UTF-8 reason of a refusal (4xx)

Why: an HTTP request costs aiohttp about 0.4 ms of Python on each end whatever its size
(the request and response objects, routing, the middlewares, the head); on the stream
the head is parsed once per connection (docs/benchmarks.md, floor).

What stays as over HTTP: the upgrade passes the connection gate and the token check like
any request (a worker token's stream may not call the run token's ops), every frame is
read and answered by `answers.answer_frame` (the same limits, NaN check, refusals and
reasons), a frame the server could not read to its end (malformed, oversized) is answered
and its connection closed (lingering: `_Receiver.linger`), since the next frame's start
is unknown, and between frames the gate counts a stream as an idle keep-alive connection
(it may be evicted as one). A stream silent for the gate's keep-alive time is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from asyncsync.clock import now
from asyncsync.engine.core import ServerCore
from asyncsync.transport.answers import Intake, answer_frame
from asyncsync.transport.connection_gate import LINGER_S, between_requests
from asyncsync.transport.tokens import BearerTokens
from asyncsync.wire.frames import CHUNK_BYTES, tensor_chunks

PATH = "/v1/stream"
UPGRADE = "tcp"
"""The ``Upgrade`` token (one aiohttp hands over raw; the stream is framed as above)."""
REQUEST = struct.Struct(">BQ")
REPLY = struct.Struct(">HQ")
MAX_OP_BYTES = 32
BUFFER_BYTES = 1 << 16
"""Each end's receive buffer for heads and small frames (a frame's tensor is received
straight into its vector); reading pauses while more than this waits unread."""
CLIENT_IDLE_S = 15.0
"""A client reuses a stream idle at most this long (well under the server's keep-alive,
so it never sends on a stream the server is closing)."""


def wants_stream(request: web.Request) -> bool:
    """Whether `request` asks to upgrade to the stream channel."""
    return (request.headers.get("Upgrade", "").strip().lower() == UPGRADE
            and "upgrade" in request.headers.get("Connection", "").lower())


async def serve_stream(request: web.Request, core: ServerCore, intake: Intake,
                       tokens: BearerTokens | None, idle_s: float,
                       live: set[asyncio.BaseTransport]) -> web.StreamResponse:
    """Upgrade `request`'s connection and answer frames on it as `intake` says, until the
    client closes it, sends nothing for `idle_s` seconds, or sends a frame that cannot be
    read to its end (or arrives slower than the intake's pace: a 408, then closed). Its
    transport is in `live` meanwhile (the server closes those when it shuts down).

    After the 101 the connection's transport is handed from its protocol (the gate's,
    around aiohttp's) to a `_Receiver`, so a frame's tensor is received straight into its
    vector, and back before the handler returns; a connection lost meanwhile is reported
    to that protocol.
    """
    if not wants_stream(request):
        return web.Response(status=400, text=f"{PATH} needs the headers Connection: "
                                             f"Upgrade and Upgrade: {UPGRADE}")
    response = web.StreamResponse(status=101, headers={"Connection": "Upgrade",
                                                       "Upgrade": UPGRADE})
    response.force_close()
    headers_writer = await response.prepare(request)
    assert isinstance(headers_writer, StreamWriter)
    transport = request.transport
    assert transport is not None and isinstance(transport, asyncio.Transport)
    owner = transport.get_protocol()  # the connection gate's, which wraps aiohttp's
    receiver = _Receiver(idle_s, on_lost=owner.connection_lost)
    transport.set_protocol(receiver)
    receiver.connection_made(transport)
    headers_writer.send_headers()
    live.add(transport)
    try:
        while await _answer_next(request, receiver, core, intake, tokens,
                                 lambda idle: between_requests(owner, idle)):
            pass
    except ConnectionError:
        pass  # the client left; nothing to answer
    finally:
        live.discard(transport)
        if not (receiver.lost or transport.is_closing()):  # else the receiver forwards
            transport.set_protocol(owner)                   # the loss when it comes
        request.protocol.force_close()  # aiohttp leaves an upgraded connection open
    return response


async def _answer_next(request: web.Request, receiver: _Receiver, core: ServerCore,
                       intake: Intake, tokens: BearerTokens | None,
                       waiting: Callable[[bool], None]) -> bool:
    """Answer a frame (`waiting` tells the gate until one begins); False: close."""
    waiting(True)
    try:
        op_bytes, length = REQUEST.unpack(await receiver.read_exactly(REQUEST.size))
        waiting(False)
    except (asyncio.IncompleteReadError, ConnectionError):  # closed, or idle
        return False
    if not 0 < op_bytes <= MAX_OP_BYTES:
        await _refuse(receiver, 400, f"op name of {op_bytes} bytes (1 to {MAX_OP_BYTES})")
        return False
    try:
        op = (await receiver.read_exactly(op_bytes)).decode("ascii")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    except UnicodeDecodeError:
        await _refuse(receiver, 400, "the op name is not ASCII")
        return False
    refusal = None if tokens is None else tokens.refusal(request, op)
    if refusal is not None:
        await _refuse(receiver, refusal.status, refusal.text or "refused")
        return False
    frame = receiver.frame(length)
    answer = await answer_frame(core, intake, op, frame.read_any, length, frame.read_into,
                                lambda: receiver.ended)
    if answer.status != 200:
        await _refuse(receiver, answer.status, answer.reason)
        if frame.remaining:
            await receiver.linger(LINGER_S)
            return False
        return True
    size = len(answer.head) + (0 if answer.vector is None else answer.vector.nbytes)
    receiver.write(REPLY.pack(200, size) + answer.head)
    if answer.vector is not None:
        for piece in tensor_chunks(answer.vector):
            receiver.write(piece)
            await receiver.drain()
    return True


async def _refuse(receiver: _Receiver, status: int, reason: str) -> None:
    text = reason.encode()
    receiver.write(REPLY.pack(status, len(text)) + text)
    await receiver.drain()


class StreamRefused(Exception):
    """The server answered the upgrade with `status` (e.g. 401, 404, 503) and `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class _Receiver(asyncio.BufferedProtocol):
    """One end of a stream: receives into a small buffer, or, while a reader waits on
    `read_into`, straight into the reader's view (a frame's tensor); writes with flow
    control.

    Args:
        idle_s: a read that gets no byte for this long raises ConnectionError (None: waits).
        on_lost: told when the connection is lost (the server's aiohttp handler).
    """

    def __init__(self, idle_s: float | None = None,
                 on_lost: Callable[[Exception | None], None] | None = None) -> None:
        self.idle_s = idle_s
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.ended = False
        self.lost = False
        self.received = 0
        self._paused = False  # reading paused: more than BUFFER_BYTES wait unread
        self._scratch = memoryview(bytearray(BUFFER_BYTES))
        # (a view: asyncio's TLS reader fills `buf[offset:]`, a copy of a bytearray's)
        self._pending = bytearray()
        self._target: memoryview | None = None
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return self._target[self._filled :]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self._target is not None:
            self._filled += nbytes
            if self._filled < len(self._target):
                return
            self._target = None
        else:
            self._pending += self._scratch[:nbytes]
            if len(self._pending) > BUFFER_BYTES and not self._paused:
                assert self.transport is not None
                self.transport.pause_reading()
                self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = self.lost = True
        self._target = None
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.on_lost is not None:
            self.on_lost(exc)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def write(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's send buffer is full; ConnectionError once closed."""
        if self._writable is not None:
            await self._writable
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the stream closed while sending")

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check_idle(self, seen: int) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self.received == seen:
            waiter.set_exception(ConnectionError(f"no bytes for {self.idle_s:g} s"))
        else:
            self._arm_idle()

    def _arm_idle(self) -> None:
        if self.idle_s is not None:
            self._idle_timer = asyncio.get_running_loop().call_later(
                self.idle_s, self._check_idle, self.received)

    async def _more(self) -> None:
        """Wait for bytes, the stream's end, or (ConnectionError) `idle_s` without bytes."""
        if self._paused and self.transport is not None:  # the reader wants more now
            self.transport.resume_reading()
            self._paused = False
        self._waiter = asyncio.get_running_loop().create_future()
        self._arm_idle()
        try:
            await self._waiter
        finally:
            self._waiter = None
            if self._idle_timer is not None:
                self._idle_timer.cancel()

    def _take(self, n: int) -> bytes:
        with memoryview(self._pending) as pending:  # one copy, not a slice's and then bytes'
            out = bytes(pending[:n])
        del self._pending[:n]
        return out

    async def read_until(self, separator: bytes, limit: int) -> bytes:
        """The bytes up to and including `separator` (ConnectionError if the stream ends
        or `limit` bytes pass first)."""
        while (end := self._pending.find(separator)) < 0:
            if self.ended or len(self._pending) > limit:
                raise ConnectionError(f"no {separator!r} in {len(self._pending)} bytes")
            await self._more()
        return self._take(end + len(separator))

    async def read_exactly(self, n: int) -> bytes:
        """The next `n` bytes (`asyncio.IncompleteReadError` if the stream ends first)."""
        while len(self._pending) < n:
            if self.ended:
                raise asyncio.IncompleteReadError(bytes(self._pending), n)
            await self._more()
        return self._take(n)

    async def read_some(self, most: int) -> bytes:
        """Up to `most` bytes, as soon as any came (b"" once the stream ended)."""
        while not self._pending and not self.ended:
            await self._more()
        return self._take(most)

    async def read_into(self, view: memoryview) -> int:
        """Fill `view`, from what is buffered, then straight from the socket; fewer bytes
        only when the stream ends."""
        filled = min(len(self._pending), len(view))
        with memoryview(self._pending) as pending:
            view[:filled] = pending[:filled]
        del self._pending[:filled]
        if filled == len(view) or self.ended:
            return filled
        self._target, self._filled = view, filled
        try:
            while self._target is not None and not self.ended:
                await self._more()
            return self._filled
        finally:
            self._target = None

    async def linger(self, seconds: float) -> None:
        """A lingering close's first half: end this side (the peer reads the answer, then
        the end), then read and drop what still comes, until the peer ends or `seconds`
        pass. A close with bytes unread would be a reset, and a reset can drop the
        answer before the peer has read it. (The gate's refusals linger the same way, for
        the same `LINGER_S`, on its own protocol: `connection_gate`.)"""
        if self.transport is None or self.lost:
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._pending.clear()
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(seconds):
                while await self.read_some(BUFFER_BYTES):
                    pass

    def frame(self, length: int) -> _Frame:
        """The next `length` bytes, as a frame's readers."""
        return _Frame(self, length)


class _Frame:
    """Reads a frame's `remaining` bytes off a `_Receiver`, in chunks (then b"") or into
    a view; both raise ConnectionError if the stream ends first."""

    def __init__(self, receiver: _Receiver, length: int) -> None:
        self.receiver = receiver
        self.remaining = length

    async def read_any(self) -> bytes:
        if self.remaining == 0:
            return b""
        chunk = await self.receiver.read_some(min(self.remaining, CHUNK_BYTES))
        if not chunk:
            raise ConnectionError("the stream ended mid-frame")
        self.remaining -= len(chunk)
        return chunk

    async def read_into(self, view: memoryview) -> int:
        want = min(self.remaining, len(view))
        got = await self.receiver.read_into(view[:want])
        self.remaining -= got
        if got < want:
            raise ConnectionError("the stream ended mid-frame")
        return got


class StreamConnection:
    """A client's upgraded connection: one request at a time (`send`, then `reply`)."""

    def __init__(self, receiver: _Receiver) -> None:
        assert receiver.transport is not None
        self.receiver = receiver
        self.transport = receiver.transport
        self.idle_since = now()

    @classmethod
    async def open(cls, url: str, token: str | None, tls: ssl.SSLContext | bool | None,
                   local_addr: str | None) -> StreamConnection:
        """Connect to the server at `url` and upgrade. Raises OSError (ssl.SSLError for a
        failed handshake; ConnectionAbortedError when the server closed the connection
        without a byte of answer) when it cannot upgrade, and `StreamRefused` when the
        server answers anything but 101."""
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        context = (tls if isinstance(tls, ssl.SSLContext) else ssl.create_default_context()
                   ) if https else None
        _, receiver = await asyncio.get_running_loop().create_connection(
            _Receiver, host, port, ssl=context,
            local_addr=(local_addr, 0) if local_addr else None)
        assert receiver.transport is not None
        transport = receiver.transport
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        transport.write(f"POST {PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                        f"Connection: Upgrade\r\nUpgrade: {UPGRADE}\r\n{auth}"
                        "Content-Length: 0\r\n\r\n".encode("utf-8", "surrogateescape"))
        upgraded = False
        try:
            head = await receiver.read_until(b"\r\n\r\n", BUFFER_BYTES)
            status = int(head.split(b" ", 2)[1])
            if upgraded := status == 101:
                return cls(receiver)
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            reason = (await receiver.read_exactly(min(length, 1000))
                      ).decode("utf-8", "replace")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError) as exc:
            kind = ConnectionError if receiver.received else ConnectionAbortedError
            raise kind(f"no upgrade from {url}: {exc!r}") from exc
        finally:  # (also when cancelled: the request's time is up)
            if not upgraded:
                transport.close()
        raise StreamRefused(status, reason)

    @property
    def reusable(self) -> bool:
        """Open, and idle briefly enough that the server keeps it."""
        return (not self.transport.is_closing() and not self.receiver.ended
                and now() - self.idle_since < CLIENT_IDLE_S)

    async def send(self, op: str, size: int,
                   pieces: AsyncIterator[bytes | memoryview]) -> None:
        """Send one request of `size` body bytes (the frame's `pieces`)."""
        name = op.encode("ascii")
        self.receiver.write(REQUEST.pack(len(name), size) + name)
        async for piece in pieces:
            self.receiver.write(piece)
            await self.receiver.drain()

    async def reply(self) -> tuple[int, int]:
        """The reply's status and body length (its body is read with `reply_body`)."""
        status, length = REPLY.unpack(await self.receiver.read_exactly(REPLY.size))
        return status, length

    def reply_body(self, length: int) -> _Frame:
        """The reply's `length` body bytes, as readers (`read_any`, `read_into`)."""
        return self.receiver.frame(length)

    def close(self) -> None:
        self.transport.close()
