"""HTTP client transport: upgraded streams (`frame_stream`, the default) or one long-lived
`aiohttp.ClientSession` posting a request per op.

Over https the server's certificate is verified against the system's trust store, or with
the context the worker's `Dial` carries (e.g. `client_tls`, trusting a private CA).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import torch

from asyncsync.clock import now
from asyncsync.engine.channel import CHANNELS, Dial, register_scheme
from asyncsync.errors import InputError
from asyncsync.hetero.network import Link
from asyncsync.training.buffers import VectorPool
from asyncsync.transport.frame_stream import StreamConnection, StreamRefused
from asyncsync.transport.gc_tuning import GcHold
from asyncsync.transport.status import refusal_from
from asyncsync.wire.frames import (
    CONTENT_TYPE,
    NUMBERED_OPS,
    FrameReader,
    Limits,
    ReadAny,
    ReadInto,
    encode_header,
    frame_pieces,
    frame_size,
    tensor_spec,
)

BUSY = 503
"""The server's gate refused the connection unread (too many connections): safe to retry."""
SLOTS_FULL = 429
"""The server refused a tensor before reading it: the rank has as many bodies arriving as
it may (`answers.BodySlots`). Safe to retry (the push was not taken), as after `BUSY`."""


class TlsFailure(InputError, ConnectionError):
    """The TLS handshake with the server failed (e.g. its certificate is not trusted)."""


class _ServerBusy(Exception):
    """The server answered `BUSY`."""


class _Resendable(Exception):
    """The server closed the connection without an answer, and the op may be resent."""


NO_STREAM = frozenset({400, 404, 405, 415})
"""Answers to a stream upgrade from a server without the stream channel (an older
asyncsync server reads ``/v1/stream`` as an op: 415 or 400; others 404 or 405), besides
any status below 400 but 101; the client then posts each request."""


class _Unreachable(Exception):
    """A stream could not be opened (the server is down or not listening yet)."""


RESENDABLE_OPS = frozenset({"status", "heartbeat"})
"""Ops that change nothing on the server when applied twice, so a request the server closed
unanswered is resent (another may have been applied before the server closed it)."""


LEAVE_RETRY_S = 5.0
"""How long a leave is retried while the server cannot be reached or is busy (at most
`connect_timeout_s`): leaving is best effort (the server drops a silent worker after its
timeout), and a worker ending because its server was unreachable need not wait as long
again."""


def client_tls(cafile: str | Path) -> ssl.SSLContext:
    """A context that trusts the CA certificates in the PEM file `cafile` (only those) and
    checks the server's host name (TLS 1.2 at least). Raises OSError or ssl.SSLError when
    the file cannot be loaded."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class HttpTransport:
    """Sends frames to ``{url}/v1/{op}`` and reads framed replies.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8470``.
        numel: the model's length: a reply vector may have at most this many elements.
        timeout_s: total time allowed for one request, held waits included; a join
            still unanswered then (held at the start barrier until every worker has
            joined, however long that takes) is sent again.
        link: an emulated link that paces the real bytes in both directions.
        local_addr: the local address to connect from (default: the system's choice).
        connect_timeout_s: how long to keep retrying a server that cannot be reached or
            is busy.
        token: sent as ``Authorization: Bearer <token>`` when given.
        tls: the context to verify an https server with (default: the system's store).
        channel: ``stream`` (frames on upgraded connections, one per request in flight;
            a server without the stream endpoint is then asked over HTTP) or ``http`` (a
            POST per request).
    """

    def __init__(self, url: str, numel: int, timeout_s: float = 600.0,
                 link: Link | None = None, local_addr: str | None = None,
                 connect_timeout_s: float = 60.0, token: str | None = None,
                 tls: ssl.SSLContext | None = None, channel: str = "stream") -> None:
        if channel not in CHANNELS:
            raise ValueError(f"channel must be one of {', '.join(CHANNELS)}, got {channel!r}")
        self.limits = Limits(numel)
        self.channel = channel
        self._streams: list[StreamConnection] = []
        self._dial = (token, tls, local_addr)
        self.url = url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.link = link
        self.bytes_up = 0
        self.bytes_down = 0
        self.buffers = VectorPool()
        """Replies are received into this pool's warm vectors (`asyncsync.training.buffers`)."""
        self.timeout_s = timeout_s
        self._opened: aiohttp.ClientSession | None = None  # made at the first POST
        self._answered = False  # whether the server has answered an upgrade yet
        self._gc: GcHold | None = None  # the collector tuned from the first request to close
        self.sent = dict.fromkeys(NUMBERED_OPS, 0)
        """Requests sent of each numbered op: each carries its number, ``seq`` (see
        `asyncsync.engine.membership`)."""

    @property
    def _session(self) -> aiohttp.ClientSession:
        """The HTTP session, opened at its first use: a transport never used (its worker
        refused in its constructor) holds nothing to close."""
        if self._opened is None:
            token, tls, local_addr = self._dial
            connector = aiohttp.TCPConnector(
                local_addr=(local_addr, 0) if local_addr else None, ssl=tls or True)
            self._opened = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers={"Content-Type": CONTENT_TYPE,
                         **({"Authorization": f"Bearer {token}"} if token else {})},
            )
        return self._opened

    async def request(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None = None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Send one request; retry with backoff while the server cannot be reached.

        Only connection failures, a busy server's 503 and a 429 (`SLOTS_FULL`) are retried
        (the request was never read, so a retry cannot apply it twice), and a connection
        the server closed without an answer when the op is in `RESENDABLE_OPS`, for up to
        `connect_timeout_s` seconds. A failed TLS handshake raises `TlsFailure` at once;
        another connection that breaks mid-request, or a try not answered within
        `timeout_s` (on either channel), raises `ConnectionError`; a 4xx raises the SDK's
        refusal. A leave is retried for `LEAVE_RETRY_S` at most.

        Each push and query is numbered (``seq``, once per call: a retry of a request
        never read is the same request). A push whose connection broke before its answer
        is not resent: it was applied once or not at all, and the worker re-syncs
        (docs/failure-handling.md).
        """
        if self._gc is None:
            self._gc = GcHold()
        if op in NUMBERED_OPS:
            self.sent[op] += 1
            header = {**header, "seq": self.sent[op]}
        deadline = now() + (min(LEAVE_RETRY_S, self.connect_timeout_s) if op == "leave"
                             else self.connect_timeout_s)
        backoff = 0.1
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):  # (aiohttp's only bounds POSTs)
                    return await self._request_once(op, header, vector)
            except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
                raise TlsFailure(
                    f"TLS with {self.url} failed ({exc}): the server must serve https with "
                    "a certificate for this host name, signed by the CA given with "
                    "--tls-ca (recipe key tls.ca) or by one the system trusts") from exc
            except StreamRefused as refused:
                if refused.status in NO_STREAM or refused.status < 400:
                    self.channel = "http"
                    continue
                raise refusal_from(refused.status, refused.reason) from refused
            except (aiohttp.ClientConnectorError, _ServerBusy, _Resendable,
                    _Unreachable) as exc:
                if now() + backoff > deadline:
                    raise ConnectionError(f"cannot reach {self.url}: {exc}") from exc
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 2.0)
            except TimeoutError as exc:  # (also aiohttp's, of the same total)
                if op == "join":  # held at the start barrier: the others may take longer
                    continue  # (the server withdraws the first at its connection's close)
                raise ConnectionError(f"request {op} to {self.url} got no answer in "
                                      f"{self.timeout_s:g} s") from exc
            except aiohttp.ClientError as exc:
                raise ConnectionError(f"request {op} to {self.url} failed: {exc}") from exc

    async def _request_once(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        if self.channel == "stream":
            return await self._stream_once(op, header, vector)
        size, pieces = await self._outgoing(header, vector)
        try:
            response = await self._session.post(f"{self.url}/v1/{op}", data=pieces,
                                                headers={"Content-Length": str(size)})
        except aiohttp.ServerDisconnectedError as exc:
            if op in RESENDABLE_OPS:
                raise _Resendable(str(exc)) from exc
            raise
        async with response as resp:
            self.bytes_up += size
            if resp.status in (BUSY, SLOTS_FULL):
                raise _ServerBusy(f"busy: {(await resp.text())[:200]}")
            if resp.status >= 400:
                reason = (await resp.text())[:500]
                raise refusal_from(resp.status, reason)
            read_any: ReadAny = resp.content.readany
            if self.link is not None:
                await self.link.one_way_delay()
                read_any = self.link.paced_reader(read_any)
            reply, out = await self._read_reply(read_any)
            self.bytes_down += resp.content_length or 0
            return reply, out

    async def _stream_once(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        stream = await self._stream()
        try:
            size, pieces = await self._outgoing(header, vector)
            await stream.send(op, size, pieces)
            self.bytes_up += size
            status, length = await stream.reply()
            body = stream.reply_body(length)
            if status != 200:
                reason = b""
                while len(reason) < min(length, 500):  # then the stream is dropped
                    reason += await body.read_any()
                stream.close()
                text = reason[:500].decode("utf-8", "replace")
                if status == SLOTS_FULL:
                    raise _ServerBusy(f"busy: {text[:200]}")
                raise refusal_from(status, text)
            if self.link is not None:  # paced chunk by chunk, so received with copies
                await self.link.one_way_delay()
                reply, out = await self._read_reply(self.link.paced_reader(body.read_any))
            else:
                reply, out = await self._read_reply(body.read_any, body.read_into)
            self.bytes_down += length
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            stream.close()
            if op in RESENDABLE_OPS:
                raise _Resendable(str(exc)) from exc
            raise ConnectionError(f"request {op} to {self.url} failed: {exc!r}") from exc
        except BaseException:
            stream.close()  # cancelled or refused mid-request: its state is unknown
            raise
        stream.idle_since = now()
        self._streams.append(stream)
        return reply, out

    async def _outgoing(self, header: dict[str, Any], vector: torch.Tensor | None,
                        ) -> tuple[int, AsyncIterator[bytes | memoryview]]:
        """A request's frame size and pieces, paced by the link (after its delay)."""
        head = encode_header(header, vector)
        pieces = frame_pieces(head, vector)
        if self.link is not None:
            await self.link.one_way_delay()
            pieces = self.link.paced_pieces(pieces)
        return frame_size(head, vector), pieces

    async def _stream(self) -> StreamConnection:
        """An idle stream to reuse, or a new one."""
        while self._streams:
            stream = self._streams.pop()
            if stream.reusable:
                return stream
            stream.close()
        token, tls, local_addr = self._dial
        try:
            stream = await StreamConnection.open(self.url, token, tls, local_addr)
        except ssl.SSLError:
            raise
        except ConnectionAbortedError as exc:  # accepted, then closed without an answer
            if not self._answered:  # not a restarting server: not an asyncsync server
                raise ConnectionError(  # (or an https one), so retrying cannot help
                    f"{self.url} closed the connection without answering: is it an "
                    "asyncsync server's URL, and does the server serve https (then give "
                    "https://)?") from exc
            raise _Unreachable(str(exc)) from exc
        except OSError as exc:
            raise _Unreachable(str(exc)) from exc
        except StreamRefused as refused:
            self._answered = True
            if refused.status == BUSY:
                raise _ServerBusy(f"busy: {refused.reason[:200]}") from refused
            raise
        self._answered = True
        return stream

    async def _read_reply(self, read_any: ReadAny, read_into: ReadInto | None = None,
                          ) -> tuple[dict[str, Any], torch.Tensor | None]:
        reader = FrameReader(read_any, self.limits.max_body_bytes, read_into)
        reply = await reader.header()
        nbytes = tensor_spec(reply, self.limits, up_to=True)
        if nbytes is None:
            await reader.end()
            return reply, None
        return reply, await reader.tensor(nbytes, self.limits.dtype, self.buffers.take)

    def wire_bytes(self, vector: torch.Tensor | None) -> int:
        """Vectors travel as their raw bytes."""
        return 0 if vector is None else vector.nbytes

    async def close(self) -> None:
        """Close its connections and end its hold on the collector's settings."""
        if self._gc is not None:
            self._gc.release()
            self._gc = None
        for stream in self._streams:
            stream.close()
        self._streams.clear()
        if self._opened is not None:
            await self._opened.close()
            self._opened = None


def dial_http(url: str, dial: Dial) -> HttpTransport:
    """The HTTP transport for a worker, as `asyncsync.engine.channel.connect` makes it
    (verifying an https server with the dial's TLS context, if it has one)."""
    return HttpTransport(url, dial.numel, link=dial.link, local_addr=dial.local_addr,
                         token=dial.token, tls=dial.tls, channel=dial.channel)


register_scheme("http", dial_http)
register_scheme("https", dial_http)
