"""HTTP hosting: the aiohttp application, and `ParameterServer` on an `AppRunner`.

One POST route per operation, frames in and out. Request bodies are streamed into a
preallocated tensor under a limit derived from the model size; replies are streamed from
the tensor the store holds (no copy). Every framing error and every refusal becomes a 4xx
with a one-line ``text/plain`` reason. With a token, every request must carry
``Authorization: Bearer <token>`` (compared in constant time) or gets a 401.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from torch import nn

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
CORE: web.AppKey[ServerCore] = web.AppKey("core")
LIMITS: web.AppKey[Limits] = web.AppKey("limits")


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
            vector = await reader.tensor(nbytes, limits.dtype)
        reply, reply_vector = await core.handle(op, header, vector)
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


def bearer_auth(token: str) -> Middleware:
    """Refuse (401) every request without ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            return web.Response(status=401, text="missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check


def make_app(core: ServerCore, token: str | None = None) -> web.Application:
    """The application serving `core` under ``/v1/{op}``, behind a bearer token if given."""
    middlewares = [bearer_auth(token)] if token else []
    limits = Limits(core.store.numel)
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=middlewares)
    app[CORE] = core
    app[LIMITS] = limits
    app.router.add_post("/v1/{op}", handle)
    return app


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
    With a `token`, every request must carry it as a bearer token; listening beyond
    loopback without one logs a warning.

    Args:
        model, protocol, workers: the initial global model, the protocol, the run's size.
        settings: the server's typed settings (optimizer, budget, evaluation, faults).
        protocol_params: the protocol's parameters (default: its defaults).
        test_data: ``(inputs, targets)`` to evaluate the global model on.
        events: the run's event log.
    """

    def __init__(self, model: nn.Module, protocol: str | Protocol, workers: int,
                 settings: ServerSettings | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, protocol_params: Any = None,
                 test_data: Any = None, events: JsonlLog | None = None) -> None:
        self.core = build_core(model, protocol, workers, settings,
                               protocol_params=protocol_params, test_data=test_data,
                               events=events)
        self.host = host
        self.port = port
        self.token = token
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Start listening; returns the base URL."""
        if self.token is None and not is_loopback(self.host):
            LOG.warning("listening on %s without a token: anyone who can reach it may push "
                        "updates (set ASYNCSYNC_TOKEN)", self.host)
        self._runner = web.AppRunner(make_app(self.core, self.token), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.core.close()

    async def __aenter__(self) -> ParameterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
