"""The connection gate: admits, watches and sheds the server's connections, in front of
aiohttp's handler (`ConnectionLimits`, `ConnectionGate`)."""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from asyncsync.clock import now
from asyncsync.transport.log_filters import AcceptFailureFilter, RepeatFilter

LOG = logging.getLogger("asyncsync.server")
CONNECTIONS_LOG = logging.getLogger("asyncsync.server.connections")
"""The gate's refusals, evictions and timeouts."""
CONNECTIONS_LOG.addFilter(RepeatFilter())
logging.getLogger("asyncio").addFilter(AcceptFailureFilter())


OWN_DESCRIPTORS = 64
"""File descriptors kept free of connections for the server's own files and sockets."""
MAX_BACKLOG = 100
"""The listen backlog when descriptors are plentiful (asyncio's default)."""
BATCHES_IN_FLIGHT = 4
"""Accept batches whose descriptors the gate may not have counted yet: a batch reaches
the gate two loop iterations after asyncio accepted it, and a connection it evicts closes
one iteration later (one more batch for margin)."""
SILENT_GRACE_S = 1.0
"""How long a connection that has sent nothing yet is safe from eviction: the bytes of a
connection accepted in a burst reach the gate an event-loop iteration or more after it
was admitted, so a complete request may be waiting unread behind its silence."""
LINGER_S = 2.0
"""How long a refused connection is read (and what it sent dropped) after its 503, so the
answer is not lost to a reset for unread bytes; the client closes first as a rule."""


def descriptor_limit() -> int | None:
    """This process's soft limit on open files (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def listen_backlog(descriptors: int | None) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one
    wake-up before the gate sees any: 1/32 of the descriptor limit, from 8 to 100."""
    return MAX_BACKLOG if descriptors is None else max(8, min(MAX_BACKLOG, descriptors // 32))


def descriptor_reserve(backlog: int) -> int:
    """Descriptors kept free of counted connections: the server's own, and room for the
    accept batches in flight, so that a burst of connections cannot exhaust them."""
    return OWN_DESCRIPTORS + (BATCHES_IN_FLIGHT + 1) * backlog  # + the refused, lingering


def descriptor_bound(limit: int, descriptors: int | None) -> int:
    """`limit`, lowered so that open connections leave `descriptor_reserve` of the
    `descriptors` this process may open free (None: unlimited)."""
    if descriptors is None:
        return limit
    return max(1, min(limit, descriptors - descriptor_reserve(listen_backlog(descriptors))))


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
            descriptor limit less `descriptor_reserve`.
        max_per_peer: connections open at once from one peer address.
        min_body_bytes_per_s: the slowest a request body may arrive, after a grace of
            `header_timeout_s` (`answers.BodyPace`; slower: 408).
        max_bodies_per_rank: tensors one rank may have arriving at once, over all its
            connections (`answers.BodySlots`, which says why; more: 429).

    Over TLS a connection counts once its handshake is done; until then only the
    handshake's time is bounded (by `header_timeout_s`).
    """

    header_timeout_s: float = 10.0
    keepalive_s: float = 75.0
    max_connections: int = 1024
    max_per_peer: int = 128
    min_body_bytes_per_s: float = 1000.0
    max_bodies_per_rank: int = 4

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "keepalive_s", "min_body_bytes_per_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("max_connections", "max_per_peer", "max_bodies_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


_BUSY_TEXT = b"too many connections"
BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
              b"Retry-After: 1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
              % (len(_BUSY_TEXT), _BUSY_TEXT))
"""What a connection over the limits is answered with; what it sent is read and dropped
for `LINGER_S` at most, then it is closed."""
HEAD_END = b"\r\n\r\n"
"""The end of a request head: from there on the connection is inside a request."""


class ConnectionGate:
    """Admits, watches and sheds the server's connections, as `ConnectionLimits` says.

    aiohttp has one timer for a connection that is idle or sends its request head too
    slowly (its keep-alive timeout, which must stay longer than clients keep idle
    connections) and no cap on connections, so each accepted connection passes this gate,
    a thin `asyncio.Protocol` in front of aiohttp's handler. A request starts when its
    head has arrived (`HEAD_END`, before aiohttp's handler runs), and a middleware
    (`track`) tells the gate when it ends.

    A connection over a limit (all connections, or those of its peer address) takes the
    place of the connection of that scope that has waited longest for a request head and
    may be evicted: one that sent part of a head, or nothing for `SILENT_GRACE_S` (an idle
    keep-alive one, or one that never spoke); an honest client sends its head at once, so
    a flood of stalled heads cannot lock it out. A connection just opened, whose request
    may sit unread, is never evicted. When no connection of the scope may be evicted, the
    new one is answered 503 with ``Retry-After`` (`BUSY_REPLY`), read to its end for
    `LINGER_S` at most and closed; the client may retry. So a request whose bytes have all
    arrived gets an answer.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        descriptors = descriptor_limit()
        self.backlog = listen_backlog(descriptors)
        """The listening socket's backlog (see `listen_backlog`)."""
        self.max_connections = descriptor_bound(limits.max_connections, descriptors)
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self.open = 0
        """Connections admitted and still open."""
        self.lingering = 0
        """Refused connections read to their end after their 503 (`LINGER_S`)."""
        self._handlers: dict[asyncio.BaseProtocol, _Connection] = {}
        self._peers: Counter[str] = Counter()
        self._waiting: dict[_Connection, None] = {}  # oldest first
        self._peer_waiting: dict[str, dict[_Connection, None]] = {}
        if self.max_connections < limits.max_connections:
            LOG.info("at most %d connections (the process may open %d files)",
                     self.max_connections, descriptors)

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
        """Close the connection of `waiting` that has waited longest and may be evicted;
        False if none may."""
        silent_since = now() - min(SILENT_GRACE_S, self.limits.header_timeout_s / 2)
        oldest = next((c for c in waiting if (c.heard or c.waiting_since <= silent_since)
                       and not c.unread()), None)
        if oldest is None:
            self.refused += 1
            CONNECTIONS_LOG.warning("refused a connection from %s: every connection %s is "
                                    "inside a request or has just opened", peer, scope)
            return False
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
        connection.heard = False
        connection.waiting_since = now()
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


def between_requests(protocol: asyncio.BaseProtocol, waiting: bool) -> None:
    """Tell the gate that the connection `protocol` (when it is the gate's) now waits for
    its next request (`waiting`: it may be evicted as an idle one), or is inside one. For a
    stream, whose frames are requests that the gate does not see (`frame_stream`)."""
    if isinstance(protocol, _Connection):
        if waiting:
            protocol.end()
        else:
            protocol.begin()


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
        self.heard = False
        """Whether it sent part of a request head since it began waiting for one."""
        self.waiting_since = 0.0
        self.refused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._head_tail = b""
        """The last bytes of a request head in progress (its end may span two reads)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if not self.gate.admit(self):
            self._refuse()
            return
        self.handler = self.make_handler()
        self.gate.opened(self, self.handler)
        self.handler.connection_made(transport)
        self._arm()

    def unread(self) -> bool:
        """Whether bytes it sent wait unread in the socket (its request, maybe whole: an
        accepted burst's bytes reach `data_received` some loop iterations later)."""
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            with socket.fromfd(sock.fileno(), sock.family, sock.type) as peek:
                return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # nothing to read now (BlockingIOError), or the socket is gone
            return False

    def _refuse(self) -> None:
        """Answer `BUSY_REPLY`, then drop what the client sends until it closes, for
        `LINGER_S` at most (at once while the gate's lingering ones are many)."""
        assert self.transport is not None
        self.transport.write(BUSY_REPLY)
        if self.gate.lingering >= self.gate.backlog or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.refused = True
        self.gate.lingering += 1
        self.transport.write_eof()
        self._deadline = asyncio.get_running_loop().call_later(LINGER_S,
                                                               self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            return  # refused: dropped
        if not self.inside:
            self.heard = True
            if self._deadline is None:
                self._arm()
            edge = self._head_tail + data[:len(HEAD_END) - 1]
            if HEAD_END in edge or HEAD_END in data:  # before aiohttp's handler starts
                self.begin()
            self._head_tail = (self._head_tail + data[1 - len(HEAD_END):])[1 - len(HEAD_END):]
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
        if self.refused:
            self.refused = False
            self.gate.lingering -= 1
        self.gate.forget(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def begin(self) -> None:
        """A request head has arrived: the request is being handled (it is not evicted)."""
        self.inside = True
        self._disarm()
        self.gate.busy(self)

    def end(self) -> None:
        """The request is answered; the connection waits for the next head."""
        self.inside = False
        self._head_tail = b""
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
