"""One request's answer, whichever channel carried it: read its frame under the op's limit,
let the core handle it, and say what to send back (`answer_frame`).

Both server channels use it: a POST to ``/v1/{op}`` (`http_server`) and a frame on an
upgraded stream (`frame_stream`), so they validate, refuse and reply alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch

from asyncsync.clock import now
from asyncsync.engine.core import ServerCore
from asyncsync.protocols.base import Refused
from asyncsync.transport.status import status_of
from asyncsync.wire.frames import (
    FrameReader,
    Limits,
    ReadAny,
    ReadInto,
    WireError,
    encode_reply,
    tensor_spec,
)


class Answer(NamedTuple):
    """A reply: status 200 with an encoded head and maybe a vector, or a 4xx and its
    one-line reason."""

    status: int
    reason: str = ""
    head: bytes = b""
    vector: torch.Tensor | None = None

T = TypeVar("T")
LOG = logging.getLogger("asyncsync.server.http")
"""Where a reply that cannot be sent (a protocol's bug) is logged (rate-limited by the
HTTP server's filters)."""


@dataclass(frozen=True)
class BodyPace:
    """The slowest a request body may arrive: its n-th byte within ``grace_s + n /
    min_bytes_per_s`` seconds of the body's start, else the request is answered 408. A
    body trickling a byte at a time cannot hold its connection (and a vector of the
    pool) for long; an honest link, however slow, sends far faster.

    Attributes:
        grace_s: seconds allowed before the rate counts (the header timeout).
        min_bytes_per_s: the lowest mean rate a body may keep.
    """

    grace_s: float
    min_bytes_per_s: float

    def guard(self, read_any: ReadAny, read_into: ReadInto | None,
              ) -> tuple[ReadAny, ReadInto | None]:
        """`read_any` and `read_into`, each raising WireError 408 when behind the pace."""
        start = now()
        received = 0

        async def waited(expected: int, read: Awaitable[T]) -> T:
            left = start + self.grace_s + (received + expected) / self.min_bytes_per_s - now()
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    return await read
            except TimeoutError:
                raise WireError(408, f"the body arrived slower than {self.min_bytes_per_s:g} "
                                     f"bytes/s (after {self.grace_s:g} s): {received} bytes "
                                     f"in {now() - start:.1f} s") from None

        async def paced_any() -> bytes:
            nonlocal received
            chunk = await waited(1, read_any())
            received += len(chunk)
            return chunk

        if read_into is None:
            return paced_any, None
        into = read_into

        async def paced_into(view: memoryview) -> int:
            nonlocal received
            got = await waited(len(view), into(view))
            received += got
            return got

        return paced_any, paced_into


class BodySlots:
    """Tensors being received per rank, at most `most` at once (`ConnectionLimits`'s
    ``max_bodies_per_rank``); one more is answered 429 before its body is read.

    Why a cap: `BodyPace` bounds how slowly one body may arrive, not how many arrive at
    once; a session's holder could otherwise open many connections (up to
    ``max_per_peer`` from each address) and trickle a model-sized body on each at the
    slowest pace allowed, holding a vector of the pool and a connection per body. A
    worker's loop has one or two requests carrying a tensor under way at a time (a push,
    and an overlapping protocol's background exchange), and its transport never resends a
    push whose body was read, so a few are plenty; one that goes over (many fragments in
    flight on a slow link) is delayed, not ended: its transport retries a 429.
    """

    def __init__(self, most: int) -> None:
        self.most = most
        self._taken: dict[int, int] = {}

    def take(self, worker: int) -> None:
        """Count a body of `worker` (WireError 429 when it has `most` under way)."""
        taken = self._taken.get(worker, 0)
        if taken >= self.most:
            raise WireError(429, f"worker {worker} already has {taken} request bodies "
                                 f"arriving (at most {self.most} at once): send one after "
                                 "another")
        self._taken[worker] = taken + 1

    def give(self, worker: int) -> None:
        """A body of `worker` has arrived (or failed)."""
        taken = self._taken.pop(worker) - 1
        if taken:
            self._taken[worker] = taken


@dataclass(frozen=True)
class Intake:
    """What a server's channels accept of a request: the model's `limits`, the slowest
    `pace` of a body and each rank's body `slots` (None: not bounded)."""

    limits: Limits
    pace: BodyPace | None = None
    slots: BodySlots | None = None


HELD_JOIN_POLL_S = 0.1
"""How often a join held at the start barrier checks that its client is still connected."""


async def held_join(core: ServerCore, handled: Awaitable[T], gone: Callable[[], bool]) -> T:
    """Await a join (`handled`) that may wait at the start barrier, cancelling it if its
    client's connection closes while the run has not started: the core then withdraws the
    join, and a restarted copy of the worker may take its rank (a client without the
    rank's secret cannot while this one stays connected). Raises ConnectionError then."""
    task = asyncio.ensure_future(handled)
    while not task.done():
        await asyncio.wait({task}, timeout=HELD_JOIN_POLL_S)
        if not task.done() and not core.run.started and gone():
            task.cancel()
            await asyncio.wait({task})
            raise ConnectionError("the client left while its join waited for the run "
                                  "to start")
    return task.result()


def body_limit(limits: Limits, op: str) -> int:
    """The largest body an op may have: a model-sized tensor for pushes and queries."""
    return limits.max_body_bytes if op in ("push", "query") else Limits(0).max_body_bytes


async def answer_frame(core: ServerCore, intake: Intake, op: str, read_any: ReadAny,
                       length: int | None, read_into: ReadInto | None = None,
                       gone: Callable[[], bool] | None = None) -> Answer:
    """Read one frame of `op` from `read_any` (which returns b"" at the frame's end; the
    frame declared `length` bytes, None when unknown), its tensor with `read_into` when
    given, and answer it, as `intake` says.

    The tensor is received into a warm vector of the core's pool and checked for NaN/Inf
    as it arrives; with a pace, a body that arrives slower is answered 408; with slots, a
    rank's tensor beyond its bodies in flight is answered 429. Raises
    ConnectionError when the peer leaves mid-frame, or (`gone` says whether the peer's
    connection has closed) while its join waits for the run to start: that join is then
    withdrawn (`held_join`).
    """
    pace, slots = intake.pace, intake.slots
    if pace is not None:
        read_any, read_into = pace.guard(read_any, read_into)
    try:
        max_total = body_limit(intake.limits, op)
        if length is not None and length > max_total:
            raise WireError(413, f"body of {length} bytes exceeds the limit of {max_total}")
        reader = FrameReader(read_any, max_total, read_into)
        header = await reader.header()
        numel = core.tensor_numel(op, header)
        tensor_limits = None if numel is None else Limits(numel)
        nbytes = tensor_spec(header, tensor_limits)
        if nbytes is None or tensor_limits is None:
            await reader.end()
            vector = None
        else:  # only a session's holder makes us receive a tensor
            worker = core.identify(op, header)
            if slots is not None and worker is not None:
                slots.take(worker)
            try:
                vector = await reader.tensor(nbytes, tensor_limits.dtype, core.buffers.take,
                                             check_finite=True)
            finally:
                if slots is not None and worker is not None:
                    slots.give(worker)
        handled = core.handle(op, header, vector, finite=reader.finite)
        if op == "join" and gone is not None and not core.run.started:
            reply, reply_vector = await held_join(core, handled, gone)
        else:
            reply, reply_vector = await handled
        head = encode_reply(reply, reply_vector, core.protocol.name, op)
    except WireError as err:
        if err.status >= 500:
            LOG.error("%s", err.reason)
        return Answer(err.status, err.reason)
    except Refused as refusal:
        return Answer(status_of(refusal), refusal.reason)
    return Answer(200, head=head, vector=reply_vector)
