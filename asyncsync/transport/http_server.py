"""HTTP hosting: the aiohttp application, and `ParameterServer` on an `AppRunner`.

One POST route per operation, frames in and out. Request bodies are streamed into a warm
tensor of the core's pool (`asyncsync.buffers`) under a limit derived from the model size,
checked for NaN/Inf as they arrive; replies are streamed from the tensor the store holds
(no copy). Every framing error and every refusal becomes a 4xx
with a one-line ``text/plain`` reason.

With a run token, every request must carry ``Authorization: Bearer <token>`` with the run
token or the run's worker token (`worker_token`, derived from it), compared in constant
time, or gets a 401, also before the body of an ``Expect: 100-continue`` request. Only the
run token may call the operations in `ADMIN_OPS` (a worker token gets a 403).

Connections pass a `ConnectionGate` (`ConnectionLimits`: time to send a request head, idle
keep-alive time, connections in total and per peer address), and the server serves TLS when
given an `ssl.SSLContext` (`server_tls`). Repeated log lines of the connection layer are
rate-limited (`RepeatFilter`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import resource
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_urldispatcher import _default_expect_handler
from torch import nn

from asyncsync.clock import now
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.metrics import JsonlLog
from asyncsync.protocols.base import Protocol, Refused
from asyncsync.transport.status import status_of
from asyncsync.wire import (
    CONTENT_TYPE,
    FrameReader,
    Limits,
    WireError,
    encode_header,
    frame_size,
    tensor_chunks,
    tensor_spec,
)

LOG = logging.getLogger("asyncsync.server")
CONNECTIONS_LOG = logging.getLogger("asyncsync.server.connections")
"""The gate's refusals, evictions and timeouts."""
HTTP_LOG = logging.getLogger("asyncsync.server.http")
"""aiohttp's own request-handling errors (malformed HTTP from peers)."""
CORE: web.AppKey[ServerCore] = web.AppKey("core")
LIMITS: web.AppKey[Limits] = web.AppKey("limits")


class RepeatFilter(logging.Filter):
    """Lets each kind of log line through at most once per `interval_s`, counting the rest.

    A kind is the line's format string and level (aiohttp's and ours are fixed strings),
    so the same refusal of many peers is one kind. The next line of a kind that passes
    says how many were held back since the last.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._kinds: dict[tuple[str, int], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (str(record.msg)[:200], record.levelno)
        t = now()
        last, held = self._kinds.get(kind, (-self.interval_s, 0))
        if t - last < self.interval_s:
            self._kinds[kind] = (last, held + 1)
            return False
        self._kinds[kind] = (t, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} more like this held back)"
            record.args = None
        return True


class PeerErrorFilter(logging.Filter):
    """Logs a request that aiohttp could not parse (the peer's error, not the server's) as
    one line with the reason, instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {' '.join(str(error).split())[:200]}"
            record.args = None
            record.exc_info = None
        return True


CONNECTIONS_LOG.addFilter(RepeatFilter())
HTTP_LOG.addFilter(RepeatFilter())
HTTP_LOG.addFilter(PeerErrorFilter())


def body_limit(limits: Limits, op: str) -> int:
    """The largest body an op may have: a model-sized tensor for pushes and queries."""
    return limits.max_body_bytes if op in ("push", "query") else Limits(0).max_body_bytes


async def handle(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    op = request.match_info["op"]
    try:
        if request.content_type != CONTENT_TYPE:
            raise WireError(415, f"content type must be {CONTENT_TYPE}")
        max_total = body_limit(request.app[LIMITS], op)
        length = request.content_length
        if length is not None and length > max_total:
            raise WireError(413, f"body of {length} bytes exceeds the limit of {max_total}")
        reader = FrameReader(request.content.readany, max_total)
        header = await reader.header()
        numel = core.tensor_numel(op, header)
        limits = None if numel is None else Limits(numel)
        nbytes = tensor_spec(header, limits)
        if nbytes is None or limits is None:
            await reader.end()
            vector = None
        else:
            vector = await reader.tensor(nbytes, limits.dtype, core.buffers.take,
                                         check_finite=True)
        reply, reply_vector = await core.handle(op, header, vector, finite=reader.finite)
    except WireError as err:
        return web.Response(status=err.status, text=err.reason)
    except Refused as refusal:
        return web.Response(status=status_of(refusal), text=refusal.reason)
    head = encode_header(reply, reply_vector)
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = frame_size(head, reply_vector)
    await response.prepare(request)
    await response.write(head)
    if reply_vector is not None:
        for piece in tensor_chunks(reply_vector):
            await response.write(piece)
    await response.write_eof()
    return response


ADMIN_OPS = frozenset({"stop"})
"""Operations only the run token may call; workers hold the worker token."""

_WORKER_TOKEN_LABEL = b"asyncsync worker token v1"


def worker_token(run_token: str) -> str:
    """The worker token of the run with `run_token` (HMAC-SHA256 of a fixed label under
    the run token): a server that knows the run token knows it too, and it does not reveal
    the run token."""
    key = run_token.encode("utf-8", "surrogateescape")
    return hmac.new(key, _WORKER_TOKEN_LABEL, hashlib.sha256).hexdigest()


class BearerTokens:
    """The run token (every operation) and the worker token derived from it (every
    operation but `ADMIN_OPS`)."""

    def __init__(self, run_token: str) -> None:
        self._run = b"Bearer " + run_token.encode("utf-8", "surrogateescape")
        self._worker = f"Bearer {worker_token(run_token)}".encode()

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when `request` may proceed, else the 401 or 403 to answer it with."""
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, self._run):
            return None
        if hmac.compare_digest(given, self._worker):
            if request.match_info.get("op") not in ADMIN_OPS:
                return None
            return web.Response(status=403, text="this operation needs the run token; a "
                                                 "worker token cannot call it")
        return web.Response(status=401, text="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


def bearer_auth(tokens: BearerTokens) -> Middleware:
    """Refuse every request without an accepted bearer token (401), or whose token may not
    call its operation (403)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = tokens.refusal(request)
        return refusal if refusal is not None else await handler(request)

    return check


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_continue(tokens: BearerTokens | None) -> ExpectHandler:
    """Answers ``Expect: 100-continue``: the token is checked first, so a refused request
    gets its 401 or 403 before it sends its body (aiohttp then reads a body that the client
    may still send for at most its lingering time, 10 s, and closes the connection)."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        refusal = tokens.refusal(request) if tokens is not None else None
        if refusal is not None:
            refusal.force_close()
            return refusal
        await _default_expect_handler(request)
        return None

    return expect


async def not_found(request: web.Request) -> web.StreamResponse:
    """Any other path or method."""
    return web.Response(status=404, text=f"no endpoint {request.method} {request.path[:100]}")


def make_app(core: ServerCore, token: str | None = None,
             gate: ConnectionGate | None = None) -> web.Application:
    """The application serving `core` under ``/v1/{op}``, behind the run's bearer token if
    given, telling `gate` (if given) when each request starts and ends."""
    tokens = BearerTokens(token) if token else None
    middlewares = ([gate.track()] if gate is not None else []) + (
        [bearer_auth(tokens)] if tokens is not None else [])
    limits = Limits(core.store.numel)
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=middlewares)
    app[CORE] = core
    app[LIMITS] = limits
    expect = expect_continue(tokens)
    app.router.add_post("/v1/{op}", handle, expect_handler=expect)
    app.router.add_route("*", "/{path:.*}", not_found, expect_handler=expect)
    return app


def server_tls(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A context serving the PEM certificate chain `cert` with the PEM private key `key`
    (TLS 1.2 at least). Raises OSError or ssl.SSLError when they cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


FD_RESERVE = 64
"""File descriptors kept free of connections for the server's own files and sockets."""


def descriptor_bound(limit: int) -> int:
    """`limit`, lowered so that open connections leave `FD_RESERVE` descriptors of this
    process's limit free (accepting a connection without a descriptor fails in a loop)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(1, min(limit, soft - FD_RESERVE))


@dataclass(frozen=True)
class ConnectionLimits:
    """How long and how many connections the server keeps (transport options, apart from
    the run's `ServerSettings`). Request lines and header fields are bounded by aiohttp
    (8190 bytes each, 128 fields).

    Attributes:
        header_timeout_s: a connection is closed unless a complete request head arrives
            within this many seconds of its opening (after the TLS handshake, which has
            the same bound) or of the first byte of a later request.
        keepalive_s: an idle keep-alive connection is closed after this long (longer than
            aiohttp clients keep idle connections, 15 s, so a client does not send on a
            connection the server is closing).
        max_connections: connections open at once; lowered to the process's file
            descriptor limit less `FD_RESERVE`.
        max_per_peer: connections open at once from one peer address.

    Over TLS a connection counts once its handshake is done; until then only the
    handshake's time is bounded (by `header_timeout_s`).
    """

    header_timeout_s: float = 10.0
    keepalive_s: float = 75.0
    max_connections: int = 1024
    max_per_peer: int = 128

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "keepalive_s", "max_connections", "max_per_peer"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


_BUSY_TEXT = b"too many connections"
BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_TEXT),
                                                                      _BUSY_TEXT))
"""What a connection over the limits is answered with, before it is closed unread."""


class ConnectionGate:
    """Admits, watches and sheds the server's connections, as `ConnectionLimits` says.

    aiohttp has one timer for a connection that is idle or sends its request head too
    slowly (its keep-alive timeout, which must stay longer than clients keep idle
    connections) and no cap on connections, so each accepted connection passes this gate,
    a thin `asyncio.Protocol` in front of aiohttp's handler; a middleware (`track`) tells
    it when a request starts and ends.

    A connection over a limit (all connections, or those of its peer address) takes the
    place of the connection of that scope that has waited longest for a request head (idle
    or half-sent); an honest client sends its head at once, so a flood of stalled heads
    cannot lock it out. When every connection of the scope is inside a request, the new
    one is answered 503 (`BUSY_REPLY`) and closed; the client may retry.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.max_connections = descriptor_bound(limits.max_connections)
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self.open = 0
        """Connections admitted and still open."""
        self._handlers: dict[asyncio.BaseProtocol, _Connection] = {}
        self._peers: Counter[str] = Counter()
        self._waiting: dict[_Connection, None] = {}  # oldest first
        self._peer_waiting: dict[str, dict[_Connection, None]] = {}
        if self.max_connections < limits.max_connections:
            LOG.info("at most %d connections (the process may open %d files)",
                     self.max_connections, self.max_connections + FD_RESERVE)

    def protocol_factory(self, handler: Callable[[], asyncio.Protocol],
                         ) -> Callable[[], asyncio.Protocol]:
        """The factory for `loop.create_server`: `handler()` (aiohttp's) behind the gate."""
        return lambda: _Connection(self, handler)

    def track(self) -> Middleware:
        """The middleware that tells the gate when a request starts and ends (outermost)."""

        @web.middleware
        async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
            connection = self._handlers.get(request.protocol)
            if connection is not None:
                connection.begin()
            try:
                return await handler(request)
            finally:
                if connection is not None:
                    connection.end()

        return track

    def admit(self, connection: _Connection) -> bool:
        """Make room for `connection` (see the class) and count it; False: refuse it."""
        peer = connection.peer
        if (self._peers[peer] >= self.limits.max_per_peer
                and not self._make_room(self._peer_waiting.get(peer, {}), peer,
                                        "from its address")):
            return False
        if self.open >= self.max_connections and not self._make_room(self._waiting, peer,
                                                                      "in all"):
            return False
        self._peers[peer] += 1
        self.open += 1
        connection.counted = True
        self.waiting(connection)
        return True

    def _make_room(self, waiting: dict[_Connection, None], peer: str, scope: str) -> bool:
        """Close the connection of `waiting` that has waited longest; False if none."""
        if not waiting:
            self.refused += 1
            CONNECTIONS_LOG.warning("refused a connection from %s: every connection %s is "
                                    "inside a request", peer, scope)
            return False
        oldest = next(iter(waiting))
        self.evicted += 1
        CONNECTIONS_LOG.info("closed a connection from %s waiting for a request head, to "
                             "admit one from %s", oldest.peer, peer)
        oldest.close()
        return True

    def opened(self, connection: _Connection, handler: asyncio.BaseProtocol) -> None:
        """`connection` is served by aiohttp's `handler`."""
        self._handlers[handler] = connection

    def waiting(self, connection: _Connection) -> None:
        """`connection` waits for a request head: it is now the newest that does."""
        self.busy(connection)
        self._waiting[connection] = None
        self._peer_waiting.setdefault(connection.peer, {})[connection] = None

    def busy(self, connection: _Connection) -> None:
        """`connection` is inside a request."""
        self._waiting.pop(connection, None)
        peer_waiting = self._peer_waiting.get(connection.peer, {})
        peer_waiting.pop(connection, None)
        if not peer_waiting:
            self._peer_waiting.pop(connection.peer, None)

    def forget(self, connection: _Connection) -> None:
        """`connection` is closed (idempotent)."""
        if connection.handler is not None:
            self._handlers.pop(connection.handler, None)
        if connection.counted:
            connection.counted = False
            self.busy(connection)
            self.open -= 1
            self._peers[connection.peer] -= 1
            if not self._peers[connection.peer]:
                del self._peers[connection.peer]


class _Connection(asyncio.Protocol):
    """One accepted connection: admitted by the gate, then served by aiohttp's handler,
    with a deadline on each request head."""

    def __init__(self, gate: ConnectionGate, make_handler: Callable[[], asyncio.Protocol],
                 ) -> None:
        self.gate = gate
        self.make_handler = make_handler
        self.handler: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.counted = False
        self.inside = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if not self.gate.admit(self):
            self.transport.write(BUSY_REPLY)
            self.transport.close()
            return
        self.handler = self.make_handler()
        self.gate.opened(self, self.handler)
        self.handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            return
        if not self.inside and self._deadline is None:
            self._arm()
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.handler is None else self.handler.eof_received()

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.gate.forget(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def begin(self) -> None:
        """A request head has arrived: the request is being handled."""
        self.inside = True
        self._disarm()
        self.gate.busy(self)

    def end(self) -> None:
        """The request is answered; the connection waits for the next head."""
        self.inside = False
        if self.counted:
            self.gate.waiting(self)

    def close(self) -> None:
        """Close the connection now (it stops counting at once)."""
        self._disarm()
        self.gate.forget(self)
        if self.transport is not None:
            self.transport.close()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.gate.limits.header_timeout_s, self._overdue)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _overdue(self) -> None:
        self._deadline = None
        if self.inside:
            return
        self.gate.timed_out += 1
        CONNECTIONS_LOG.info("closed a connection from %s: no complete request head within "
                             "%g s", self.peer, self.gate.limits.header_timeout_s)
        self.close()


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ParameterServer:
    """A `ServerCore` served over HTTP on an aiohttp `AppRunner` (for embedding and the CLI).

    Binds to 127.0.0.1 unless `host` says otherwise; port 0 picks a free port (see `url`).
    With a `token` (the run token), every request must carry it or the worker token derived
    from it (`worker_token`) as a bearer token; listening beyond loopback without one logs
    a warning.

    Args:
        model, protocol, workers: the initial global model, the protocol, the run's size.
        settings: the server's typed settings (optimizer, budget, evaluation, faults).
        protocol_params: the protocol's parameters (default: its defaults).
        test_data: ``(inputs, targets)`` to evaluate the global model on.
        events: the run's event log.
        tls: serve https with this context (see `server_tls`).
        connections: bounds on connections (default: `ConnectionLimits()`).
    """

    def __init__(self, model: nn.Module, protocol: str | Protocol, workers: int,
                 settings: ServerSettings | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, protocol_params: Any = None,
                 test_data: Any = None, events: JsonlLog | None = None,
                 tls: ssl.SSLContext | None = None,
                 connections: ConnectionLimits | None = None) -> None:
        self.core = build_core(model, protocol, workers, settings,
                               protocol_params=protocol_params, test_data=test_data,
                               events=events)
        self.host = host
        self.port = port
        self.token = token
        self.tls = tls
        self.gate = ConnectionGate(connections or ConnectionLimits())
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def start(self) -> str:
        """Start listening; returns the base URL."""
        if self.token is None and not is_loopback(self.host):
            LOG.warning("listening on %s without a token: anyone who can reach it may push "
                        "updates (set ASYNCSYNC_TOKEN)", self.host)
        limits = self.gate.limits
        self._runner = web.AppRunner(make_app(self.core, self.token, self.gate),
                                     access_log=None, logger=HTTP_LOG,
                                     keepalive_timeout=limits.keepalive_s)
        await self._runner.setup()
        assert self._runner.server is not None
        self._listener = await asyncio.get_running_loop().create_server(
            self.gate.protocol_factory(self._runner.server), self.host, self.port,
            ssl=self.tls, ssl_handshake_timeout=limits.header_timeout_s if self.tls else None)
        self.port = self._listener.sockets[0].getsockname()[1]
        return self.url

    async def stop(self) -> None:
        """End the run now (workers get ``stop`` on their next request)."""
        await self.core.stop()

    async def wait_finished(self, grace_s: float = 30.0) -> None:
        """Wait for the run to stop and every worker to leave (at most `grace_s` after stop)."""
        while not self.core.store.stopping:
            await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(self.core.finished.wait(), grace_s)
        except TimeoutError:
            self.core.run.log("leave_timeout")

    async def close(self) -> None:
        await self.core.stop()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        await self.core.close()

    async def __aenter__(self) -> ParameterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
