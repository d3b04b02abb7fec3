"""Bearer tokens: the run token, the worker token derived from it, and their checks on
each request (a middleware, and the answer to ``Expect: 100-continue``)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_urldispatcher import _default_expect_handler

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

    def refusal(self, request: web.Request, op: str | None = None) -> web.Response | None:
        """None when `request` may call `op` (default: its route's), else the 401 or 403
        to answer it with."""
        op = request.match_info.get("op") if op is None else op
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, self._run):
            return None
        if hmac.compare_digest(given, self._worker):
            if op not in ADMIN_OPS:
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
