"""The aiohttp application: one POST route per operation, frames in and out.

Request bodies are streamed into a preallocated tensor under a limit derived from the model
size; replies are streamed from the tensor the store holds (no copy). Every `WireError`
becomes a 4xx with a one-line ``text/plain`` reason. With a token, every request must carry
``Authorization: Bearer <token>`` (compared in constant time) or gets a 401.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from asyncsync.wire import (
    CONTENT_TYPE,
    FrameReader,
    WireError,
    encode_header,
    frame_size,
    tensor_chunks,
    tensor_spec,
)

if TYPE_CHECKING:
    from asyncsync.server import ServerCore

CORE: web.AppKey[ServerCore] = web.AppKey("core")


async def handle(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    op = request.match_info["op"]
    try:
        if request.content_type != CONTENT_TYPE:
            raise WireError(415, f"content type must be {CONTENT_TYPE}")
        max_total = core.body_limit(op)
        length = request.content_length
        if length is not None and length > max_total:
            raise WireError(413, f"body of {length} bytes exceeds the limit of {max_total}")
        reader = FrameReader(request.content.readany, max_total)
        header = await reader.header()
        limits = core.tensor_limits(op, header)
        nbytes = tensor_spec(header, limits)
        if nbytes is None or limits is None:
            await reader.end()
            vector = None
        else:
            vector = await reader.tensor(nbytes, limits.dtype)
        reply, reply_vector = await core.handle(op, header, vector)
    except WireError as err:
        return web.Response(status=err.status, text=err.reason)
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
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return web.Response(status=401, text="missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check


def make_app(core: ServerCore, token: str | None = None) -> web.Application:
    """The application serving `core` under ``/v1/{op}``, behind a bearer token if given."""
    middlewares = [bearer_auth(token)] if token else []
    app = web.Application(client_max_size=core.limits.max_body_bytes, middlewares=middlewares)
    app[CORE] = core
    app.router.add_post("/v1/{op}", handle)
    return app
