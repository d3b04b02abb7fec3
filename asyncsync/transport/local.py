"""In-process transport: calls a `ServerCore` directly (tests, and one-process runs).

Headers make the same msgpack round trip as on the wire and vectors are copied in both
directions, so a protocol cannot come to rely on sharing memory with the server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from asyncsync.clock import now as clock_now
from asyncsync.engine.core import ServerCore
from asyncsync.hetero.network import Link, ServerLink, sleep_until
from asyncsync.transport.status import refusal_from
from asyncsync.wire.frames import (
    NUMBERED_OPS,
    PREFIX,
    Limits,
    WireError,
    decode_header,
    encode_header,
    encode_reply,
    tensor_spec,
)


def _heard(task: asyncio.Future[Any]) -> None:
    """Mark a finished request's outcome as heard (its caller may have gone)."""
    if not task.cancelled():
        task.exception()


class LocalTransport:
    """A client transport bound to an in-process `ServerCore`, optionally over a `Link` and
    the server's shared `ServerLink` (whole messages are paced: a message is through when
    both links have carried it).

    `payload_scale` multiplies the bytes a vector is charged (links and byte counts): a
    timing-only run carries a tiny stand-in vector for the large model it declares.
    `overhead_s` is charged to each direction of every message after its bytes are
    through: the software cost of a message (HTTP, framing, the server's checks) that a
    real run pays and the link model does not.
    """

    def __init__(self, core: ServerCore, link: Link | None = None,
                 server_link: ServerLink | None = None, payload_scale: float = 1.0,
                 overhead_s: float = 0.0) -> None:
        if not payload_scale > 0:
            raise ValueError(f"payload_scale must be > 0, got {payload_scale}")
        if not 0 <= overhead_s < float("inf"):
            raise ValueError(f"overhead_s must be >= 0 and finite, got {overhead_s}")
        self.overhead_s = overhead_s
        self.core = core
        self.link = link
        self.server_link = server_link
        self.payload_scale = payload_scale
        self.bytes_up = 0
        self.bytes_down = 0
        self.sent = dict.fromkeys(NUMBERED_OPS, 0)
        """Requests sent of each numbered op: each carries its number, ``seq`` (see
        `asyncsync.engine.membership`)."""

    async def request(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None = None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        if op in NUMBERED_OPS:
            self.sent[op] += 1
            header = {**header, "seq": self.sent[op]}
        head = encode_header(header, vector)
        del header  # the caller's only reference (the worker's): the encoding stands for it
        up = len(head) + self.wire_bytes(vector)
        self.bytes_up += up
        await self._carry(up, incoming=True)
        try:
            decoded = decode_header(memoryview(head)[PREFIX.size :])
            del head  # not held while the server holds the request (e.g. at a barrier)
            numel = self.core.tensor_numel(op, decoded)
            tensor_spec(decoded, None if numel is None else Limits(numel))
            sent = None if vector is None else vector.clone()
            del vector  # the caller's: not held while the server holds the request
            # As over HTTP, a request the server has begun runs to its end even when the
            # caller is cancelled (a worker killed mid-request): rules never see half a push.
            # Its refusal then has nobody to hear it, and is not an error to print.
            # A join cancelled while it waits for the run to start is withdrawn instead,
            # as over HTTP when its connection closes: a restarted worker takes the rank.
            handled = asyncio.ensure_future(self.core.handle(op, decoded, sent))
            del sent  # the server's now: dropped once its rule is done with it
            handled.add_done_callback(_heard)
            try:
                reply, out = await asyncio.shield(handled)
            except asyncio.CancelledError:
                if op == "join" and not self.core.run.started:
                    handled.cancel()
                raise
            reply_head = encode_reply(reply, out, self.core.protocol.name, op)
        except WireError as err:
            raise refusal_from(err.status, err.reason) from None
        down = len(reply_head) + self.wire_bytes(out)
        self.bytes_down += down
        await self._carry(down, incoming=False)
        return (decode_header(memoryview(reply_head)[PREFIX.size :]),
                None if out is None else out.clone())

    def wire_bytes(self, vector: torch.Tensor | None) -> int:
        """The bytes a message's vector is charged (scaled by `payload_scale`)."""
        return 0 if vector is None else round(vector.nbytes * self.payload_scale)

    async def _carry(self, nbytes: int, incoming: bool) -> None:
        """One direction of a message: latency, then the bytes through both links."""
        through = clock_now()
        if self.link is not None:
            await self.link.one_way_delay()
            through = (self.link.up if incoming else self.link.down).reserve(nbytes)
        if self.server_link is not None:
            server = self.server_link.incoming if incoming else self.server_link.outgoing
            through = max(through, server.reserve(nbytes))
        await sleep_until(through + self.overhead_s)

    async def close(self) -> None:
        """Nothing to release."""
