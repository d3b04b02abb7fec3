"""One request's answer, whichever channel carried it: read its frame under the op's limit,
let the core handle it, and say what to send back (`answer_frame`).

Both server channels use it: a POST to ``/v1/{op}`` (`http_server`) and a frame on an
upgraded stream (`frame_stream`), so they validate, refuse and reply alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
    encode_header,
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


def body_limit(limits: Limits, op: str) -> int:
    """The largest body an op may have: a model-sized tensor for pushes and queries."""
    return limits.max_body_bytes if op in ("push", "query") else Limits(0).max_body_bytes


async def answer_frame(core: ServerCore, limits: Limits, op: str, read_any: ReadAny,
                       length: int | None, read_into: ReadInto | None = None,
                       pace: BodyPace | None = None) -> Answer:
    """Read one frame of `op` from `read_any` (which returns b"" at the frame's end; the
    frame declared `length` bytes, None when unknown), its tensor with `read_into` when
    given, and answer it.

    The tensor is received into a warm vector of the core's pool and checked for NaN/Inf
    as it arrives; with a `pace`, a body that arrives slower is answered 408. Raises
    ConnectionError when the peer leaves mid-frame.
    """
    if pace is not None:
        read_any, read_into = pace.guard(read_any, read_into)
    try:
        max_total = body_limit(limits, op)
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
        else:
            core.identify(op, header)  # only a session's holder makes us receive a tensor
            vector = await reader.tensor(nbytes, tensor_limits.dtype, core.buffers.take,
                                         check_finite=True)
        reply, reply_vector = await core.handle(op, header, vector, finite=reader.finite)
    except WireError as err:
        return Answer(err.status, err.reason)
    except Refused as refusal:
        return Answer(status_of(refusal), refusal.reason)
    return Answer(200, head=encode_header(reply, reply_vector), vector=reply_vector)
