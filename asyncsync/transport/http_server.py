"""HTTP hosting: the aiohttp application, and `ParameterServer` on an `AppRunner`.

One POST route per operation, frames in and out. Request bodies are streamed into a warm
tensor of the core's pool (`asyncsync.training.buffers`) under a limit derived from the model size,
checked for NaN/Inf as they arrive; replies are streamed from the tensor the store holds
(no copy). Every framing error and every refusal becomes a 4xx
with a one-line ``text/plain`` reason.

With a run token, every request must carry it or the run's worker token (`tokens`).
Connections pass a `ConnectionGate` (`connection_gate`), and the server serves TLS when
given an `ssl.SSLContext` (`server_tls`). Repeated log lines of the connection layer are
rate-limited (`log_filters`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from torch import nn

from asyncsync.engine.compute import enter_loop, leave_loop
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import Protocol
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.schema import ConfigError
from asyncsync.transport.answers import BodyPace, BodySlots, Intake, answer_frame
from asyncsync.transport.connection_gate import ConnectionGate, ConnectionLimits
from asyncsync.transport.frame_stream import PATH as STREAM_PATH
from asyncsync.transport.frame_stream import serve_stream
from asyncsync.transport.gc_tuning import GcHold
from asyncsync.transport.log_filters import PeerErrorFilter, RepeatFilter
from asyncsync.transport.tokens import BearerTokens, bearer_auth, expect_continue
from asyncsync.wire.frames import CONTENT_TYPE, Limits, frame_size, tensor_chunks

LOG = logging.getLogger("asyncsync.server")
HTTP_LOG = logging.getLogger("asyncsync.server.http")
"""aiohttp's own request-handling errors (malformed HTTP from peers), and clients that
left mid-request."""
CORE: web.AppKey[ServerCore] = web.AppKey("core")
INTAKE: web.AppKey[Intake] = web.AppKey("intake")
HTTP_LOG.addFilter(RepeatFilter())
HTTP_LOG.addFilter(PeerErrorFilter())
logging.getLogger("asyncsync.server.sessions").addFilter(RepeatFilter())  # (takeovers)


async def handle(request: web.Request) -> web.StreamResponse:
    """Answer one request; a client that leaves before its answer is one log line (its
    connection is gone, so what is returned is never sent)."""
    op = request.match_info["op"]
    try:
        if request.content_type != CONTENT_TYPE:
            return web.Response(status=415, text=f"content type must be {CONTENT_TYPE}")
        answer = await answer_frame(request.app[CORE], request.app[INTAKE], op,
                                    request.content.readany, request.content_length,
                                    gone=lambda: request.transport is None)
        if answer.status == 408:  # the rest of its body is not read: the connection goes
            late = web.Response(status=408, text=answer.reason)
            late.force_close()
            return late
        if answer.status != 200:
            return web.Response(status=answer.status, text=answer.reason)
        return await send_frame(request, answer.head, answer.vector)
    except ConnectionError as err:
        HTTP_LOG.info("a client at %s left during its %s request: %s", request.remote, op,
                      err)
        gone = web.Response(status=400, text="the client left")
        gone.force_close()
        return gone
    except web.RequestPayloadError as err:  # e.g. a Content-Encoding its bytes do not follow
        reason = f"the body cannot be read: {payload_problem(err)}"
        HTTP_LOG.info("a client at %s sent a %s request whose %s", request.remote, op,
                      reason[4:])
        request.content.feed_eof()  # nothing more of it can be read: aiohttp must not try
        broken = web.Response(status=400, text=reason)
        broken.force_close()
        return broken


def payload_problem(error: web.RequestPayloadError) -> str:
    """aiohttp's reason why a body cannot be read (a bad content encoding or chunk), on
    one line."""
    cause = error.__cause__
    text = cause.message if isinstance(cause, HttpProcessingError) else str(error)
    return " ".join(str(text).split())[:200]


async def send_frame(request: web.Request, head: bytes, vector: torch.Tensor | None,
                     ) -> web.StreamResponse:
    """Stream a framed reply: the encoded head, then the tensor's zero-copy pieces. Raises
    ConnectionError when the client has left."""
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = frame_size(head, vector)
    await response.prepare(request)
    await response.write(head)
    if vector is not None:
        for piece in tensor_chunks(vector):
            await response.write(piece)
    await response.write_eof()
    return response


async def not_found(request: web.Request) -> web.StreamResponse:
    """Any other path or method."""
    return web.Response(status=404, text=f"no endpoint {request.method} {request.path[:100]}")


def make_app(core: ServerCore, token: str | None = None,
             gate: ConnectionGate | None = None) -> web.Application:
    """The application serving `core` under ``/v1/{op}`` and on upgraded streams
    (`frame_stream`), behind the run's bearer token if given, telling `gate` (if given)
    when each request starts and ends (a stream's frames are its requests)."""
    tokens = BearerTokens(token) if token else None
    middlewares = ([gate.track()] if gate is not None else []) + (
        [bearer_auth(tokens)] if tokens is not None else [])
    limits = Limits(core.store.numel)
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=middlewares)
    app[CORE] = core
    expect = expect_continue(tokens)
    connection_limits = gate.limits if gate is not None else ConnectionLimits()
    idle_s = connection_limits.keepalive_s
    intake = app[INTAKE] = Intake(limits, BodyPace(connection_limits.header_timeout_s,
                                                   connection_limits.min_body_bytes_per_s),
                                  BodySlots(connection_limits.max_bodies_per_rank))
    streams: set[asyncio.BaseTransport] = set()

    async def stream(request: web.Request) -> web.StreamResponse:
        return await serve_stream(request, core, intake, tokens, idle_s, streams)

    async def close_streams(app: web.Application) -> None:
        for transport in list(streams):  # their handlers end at once
            transport.close()

    app.on_shutdown.append(close_streams)

    app.router.add_post(STREAM_PATH, stream, expect_handler=expect)
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
        model: the initial global model.
        protocol: a registered name or a `Protocol`.
        workers: the run's size (workers expected to join).
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
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0-65535 (0: any free port), got "
                             f"{port!r}")
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("token must be a non-empty str (None: no token)")
        if not isinstance(host, str) or not host:  # asyncio takes None and "" for "all"
            raise ConfigError(f"host must be a non-empty str, the address to listen on "
                              f"('0.0.0.0' for every interface), got {host!r}")  # (--host)
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise ValueError(f"tls must be an ssl.SSLContext (server_tls(cert, key) makes one), "
                             f"got a {type(tls).__name__}")
        if connections is not None and not isinstance(connections, ConnectionLimits):
            raise ValueError(f"connections must be a ConnectionLimits, got a "
                             f"{type(connections).__name__}")
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
        self._gc: GcHold | None = None
        self._closed = False

    @property
    def url(self) -> str:
        """The base URL (an IPv6 host in brackets); with port 0, known once `start` has
        picked the port."""
        if not self.port:
            raise RuntimeError("the server has no port yet: `await server.start()` picks a "
                               "free one and returns the URL (or give port=...)")
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def start(self) -> str:
        """Start listening; returns the base URL. A server starts once (a closed one cannot
        serve its run again: make a new one); when it cannot listen (e.g. its port is in
        use) the OSError is raised and nothing is left open."""
        if self._listener is not None:
            raise RuntimeError(f"the server is already listening at {self.url}")
        if self._closed:
            raise RuntimeError("the server was closed and its run ended: make a new "
                               "ParameterServer to serve another")
        if self.token is None and not is_loopback(self.host):
            LOG.warning("listening on %s without a token: anyone who can reach it may push "
                        "updates (set ASYNCSYNC_TOKEN)", self.host)
        self._gc = GcHold()  # (released by close, or below when it cannot listen)
        limits = self.gate.limits
        runner = web.AppRunner(make_app(self.core, self.token, self.gate), access_log=None,
                               logger=HTTP_LOG, keepalive_timeout=limits.keepalive_s)
        await runner.setup()
        assert runner.server is not None
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self.gate.protocol_factory(runner.server), self.host, self.port,
                backlog=self.gate.backlog, ssl=self.tls,
                ssl_handshake_timeout=limits.header_timeout_s if self.tls else None)
        except BaseException:
            self._gc.release()
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = self._listener.sockets[0].getsockname()[1]
        enter_loop()  # a worker on this loop no longer holds it for a step
        return self.url

    async def stop(self) -> None:
        """End the run now (workers get ``stop`` on their next request)."""
        await self.core.stop()

    async def wait_finished(self, grace_s: float = 30.0) -> None:
        """Wait for the run to stop and every worker to leave (at most `grace_s` after stop)."""
        if self._listener is None and not self.core.store.stopping:
            raise RuntimeError("the server is not listening, so its run cannot end: "
                               "`await server.start()` first")
        while not self.core.store.stopping:
            await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(self.core.finished.wait(), grace_s)
        except TimeoutError:
            self.core.run.log("leave_timeout")

    async def close(self) -> None:
        """End the run and stop listening. Workers still in a run that was not stopped
        first find the server gone, and retry until their connection timeout: to let
        them hear ``stop`` and leave, `stop` and `wait_finished` first."""
        if self._listener is not None and not self.core.store.stopping and self.core.store.live:
            LOG.warning("closing with workers %s still in the run: they will find the server "
                        "gone and end with a ConnectionError after retrying; call stop() and "
                        "wait_finished() before close() to let them leave",
                        ", ".join(map(str, sorted(self.core.store.live))))
        self._closed = True
        await self.core.stop()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
            leave_loop()
        if self._gc is not None:
            self._gc.release()
        await self.core.close()

    async def __aenter__(self) -> ParameterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
