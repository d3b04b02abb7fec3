"""Message framing: a length-prefixed msgpack header followed by raw tensor bytes.

Frame layout (requests and responses alike)::

    uint32 big-endian  header length H
    H bytes            msgpack map (str keys); when a tensor follows it holds
                       "tensor": {"dtype": "float32", "shape": [n]}
    n * itemsize bytes the tensor's raw little-endian bytes, nothing else

A compressed push carries a uint8 tensor of encoded bytes and a "codec" map beside
"tensor" (see `asyncsync.wire.codecs`); its length must be the one the codec implies.

No pickle, no base64, no per-element encoding. The receiver reads the tensor bytes
straight into a preallocated tensor (the one copy of that direction); the sender streams
memoryview slices of the tensor it already holds (no copy in user space).

Every validation failure raises :class:`WireError`, which carries the HTTP status and a
one-line reason; the HTTP layer turns it into a 4xx reply.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from asyncsync.protocols.base import all_finite
from asyncsync.protocols.messages import brief
from asyncsync.wire.codecs import payload_bytes

CONTENT_TYPE = "application/x-asyncsync"
PREFIX = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 1024
NUMBERED_OPS = frozenset({"push", "query"})
"""Ops whose requests carry ``seq``, their number in the session (each op counts from 1;
a replay is refused: `asyncsync.engine.membership`)."""
CHUNK_BYTES = 1 << 20

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "uint8": torch.uint8}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class WireError(Exception):
    """A message that cannot be accepted; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts: the expected tensor length and the byte budget it implies."""

    numel: int
    dtype: torch.dtype = torch.float32

    @property
    def tensor_bytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def max_body_bytes(self) -> int:
        return PREFIX.size + MAX_HEADER_BYTES + self.tensor_bytes


def encode_header(header: dict[str, Any], tensor: torch.Tensor | None) -> bytes:
    """Pack the prefix and header; adds the tensor descriptor when a tensor follows."""
    if tensor is not None:
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"unsupported dtype {tensor.dtype}")
        header = {**header, "tensor": {"dtype": DTYPE_NAMES[tensor.dtype],
                                       "shape": list(tensor.shape)}}
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(packed)} bytes exceeds {MAX_HEADER_BYTES}")
    return PREFIX.pack(len(packed)) + packed


MSGPACK_INTS = (-(2**63), 2**64 - 1)
"""The integers msgpack carries."""


def encode_reply(reply: dict[str, Any], tensor: torch.Tensor | None, protocol: str,
                 op: str) -> bytes:
    """`encode_header` for a server's reply to `op`. A reply the wire cannot carry (a rule
    of `protocol` answering meta that holds a set, a tensor, a non-str key, ...) is a
    `WireError` 500 naming the first key at fault and saying that the request was carried
    out (the worker ends with it: a re-sync would meet it again). The engine sees a rule's
    meta only once the rule has committed, so it cannot refuse before the commit
    (`asyncsync.protocols.testing.wire_meta` refuses such a rule in its tests)."""
    try:
        return encode_header(reply, tensor)
    except (TypeError, ValueError, OverflowError) as exc:
        raise unsent(protocol, op, unsendable(reply.get("meta"), exc)) from None


def reply_meta(meta: object, protocol: str, op: str) -> dict[str, Any]:
    """A rule's reply `meta` for `op`, which must be a map (else a WireError 500, as in
    `encode_reply`)."""
    if not isinstance(meta, dict):
        raise unsent(protocol, op, f"a {type(meta).__name__}, not a map")
    return meta


def unsent(protocol: str, op: str, problem: str) -> WireError:
    """The 500 for a reply the wire cannot carry: a rule's bug, after it ran."""
    return WireError(500, f"protocol {protocol!r} answered this {op} with reply meta the "
                          f"wire cannot carry ({problem}); the {op} was carried out (a push "
                          "stays applied); the protocol has a bug")


def unsendable(meta: object, error: Exception) -> str:
    """What in `meta` msgpack cannot carry: its first key at fault, else `error`."""
    pending: list[tuple[str, object]] = [("meta", meta)]
    while pending:
        path, value = pending.pop()
        shown = repr(path.removeprefix("meta."))
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                return f"{shown} has a key that is not a str"
            pending.extend((f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            pending.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, int) and not MSGPACK_INTS[0] <= value <= MSGPACK_INTS[1]:
            return f"{shown} is an int beyond 64 bits"
        elif not isinstance(value, str | bytes | int | float | type(None)):
            return (f"{shown} is a {type(value).__name__}; the wire carries str, bytes, int, "
                    "float, bool, None, lists and maps")
    return " ".join(str(error).split())[:200]


def tensor_chunks(tensor: torch.Tensor, chunk: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """Zero-copy byte views of a contiguous CPU tensor, `chunk` bytes at a time."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("tensor_chunks needs a contiguous CPU tensor")
    view = tensor.numpy().data.cast("B")
    for start in range(0, len(view), chunk):
        yield view[start : start + chunk]


def frame_size(prefix_and_header: bytes, tensor: torch.Tensor | None) -> int:
    body = 0 if tensor is None else tensor.numel() * tensor.element_size()
    return len(prefix_and_header) + body


async def frame_pieces(
    head: bytes, tensor: torch.Tensor | None
) -> AsyncIterator[bytes | memoryview]:
    """Yield an encoded head and the tensor's bytes, for a streaming HTTP body."""
    yield head
    if tensor is not None:
        for piece in tensor_chunks(tensor):
            yield piece


def decode_header(raw: bytes | memoryview) -> dict[str, Any]:
    """Unpack a header; anything but a str-keyed map is a 400."""
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(400, f"malformed msgpack header: {type(exc).__name__}") from exc
    if not isinstance(header, dict):
        raise WireError(400, "header must be a msgpack map")
    return header


def tensor_spec(header: dict[str, Any], limits: Limits | None,
                up_to: bool = False) -> int | None:
    """Validate the tensor descriptor against `limits`; return its byte length or None.

    With `up_to`, any length from 1 to ``limits.numel`` is accepted (a client reading
    replies that may hold a model fragment).
    """
    spec = header.get("tensor")
    if spec is None:
        return None
    if limits is None:
        raise WireError(400, "this message carries no tensor")
    if not isinstance(spec, dict):
        raise WireError(400, "'tensor' must be a map with dtype and shape")
    if "codec" in header:
        if up_to:
            raise WireError(400, "replies are never compressed")
        return _compressed_spec(spec, header["codec"], limits)
    dtype = spec.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES or DTYPES[dtype] != limits.dtype:
        raise WireError(422, f"wrong dtype {brief(dtype)}: expected "
                             f"{DTYPE_NAMES[limits.dtype]!r}")
    shape = spec.get("shape")
    if up_to and isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) \
            and not isinstance(shape[0], bool) and 0 < shape[0] <= limits.numel:
        return shape[0] * limits.dtype.itemsize
    if shape != [limits.numel]:
        raise WireError(422, f"wrong shape {brief(shape)}: expected [{limits.numel}]")
    return limits.tensor_bytes


def _compressed_spec(spec: dict[str, Any], codec: object, limits: Limits) -> int:
    """The byte length of a compressed payload: uint8, as long as its codec implies."""
    size = payload_bytes(codec, limits.numel)  # raises BadRequest (a 400) when malformed
    if spec.get("dtype") != "uint8":
        raise WireError(422, f"wrong dtype {brief(spec.get('dtype'))} for a compressed "
                             "payload: expected 'uint8'")
    if spec.get("shape") != [size]:
        raise WireError(422, f"wrong shape {brief(spec.get('shape'))} for this codec: "
                             f"expected [{size}]")
    return size


ReadAny = Callable[[], Awaitable[bytes]]
ReadInto = Callable[[memoryview], Awaitable[int]]
"""Fills a view with the stream's next bytes and says how many it wrote (fewer than the
view holds only when the stream ended): lets a reader receive straight into a tensor."""
Allocate = Callable[[int, torch.dtype], torch.Tensor]
"""Makes the tensor a body is read into: ``(numel, dtype) -> tensor`` (e.g. a pool's)."""
CHECK_BYTES = 1 << 18
"""Received bytes checked for NaN/Inf at a time (a slice that is still in the cache)."""


def _allocate(numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype)


class _FiniteChecker:
    """Checks a float32 tensor for NaN/Inf while it fills, `CHECK_BYTES` at a time."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.checked = 0  # elements
        self.finite = True

    def advance(self, filled_bytes: int) -> None:
        """Check the whole elements filled since the last call, once enough arrived."""
        upto = filled_bytes // 4
        if self.finite and (upto - self.checked) * 4 >= CHECK_BYTES:
            self.finite = all_finite(self.tensor[self.checked : upto])
            self.checked = upto

    def finish(self) -> bool:
        if self.finite and self.checked < self.tensor.numel():
            self.finite = all_finite(self.tensor[self.checked :])
        return self.finite


class FrameReader:
    """Reads one frame from a byte stream that yields arbitrary chunks (b"" at EOF), and
    the tensor with `read_into`, when the stream has it, without a copy of its own."""

    def __init__(self, read_any: ReadAny, max_total: int,
                 read_into: ReadInto | None = None) -> None:
        self._read_any = read_any
        self._read_into = read_into
        self._pending = bytearray()
        self._total = 0
        self._max_total = max_total
        self._compressed = False
        self.finite: bool | None = None
        """Whether the tensor read holds no NaN or Inf (None: not checked)."""

    async def _fill(self, want: int) -> None:
        while len(self._pending) < want:
            chunk = await self._read_any()
            if not chunk:
                raise WireError(400, f"truncated body: ended after {self._total} bytes")
            self._total += len(chunk)
            if self._total > self._max_total:
                raise WireError(413, f"body exceeds the limit of {self._max_total} bytes")
            self._pending += chunk

    async def _take(self, n: int) -> bytes:
        await self._fill(n)
        out = bytes(self._pending[:n])
        del self._pending[:n]
        return out

    async def header(self) -> dict[str, Any]:
        (length,) = PREFIX.unpack(await self._take(PREFIX.size))
        if length > MAX_HEADER_BYTES:
            raise WireError(413, f"header of {length} bytes exceeds {MAX_HEADER_BYTES}")
        header = decode_header(await self._take(length))
        self._compressed = "codec" in header
        return header

    async def tensor(self, nbytes: int, dtype: torch.dtype, allocate: Allocate = _allocate,
                     check_finite: bool = False) -> torch.Tensor:
        """Read exactly `nbytes` into a tensor of `dtype` (of uint8 when the header declared
        a compressed payload) from `allocate`, then require end of stream.

        With `check_finite`, a float32 tensor is checked for NaN and Inf slice by slice as
        its bytes arrive, while they are still in the cache: `finite` holds the outcome
        (None when not checked). A non-finite value is not an error here: the core
        decides what to refuse, and in which order.
        """
        if self._compressed:
            dtype = torch.uint8
        out = allocate(nbytes // dtype.itemsize, dtype)
        view = out.numpy().data.cast("B")
        checker = _FiniteChecker(out) if check_finite and dtype == torch.float32 else None
        filled = min(len(self._pending), nbytes)
        view[:filled] = self._pending[:filled]
        del self._pending[:filled]
        while filled < nbytes and self._read_into is not None:
            if checker is not None:
                checker.advance(filled)
            want = min(nbytes - filled, CHUNK_BYTES if checker is None else CHECK_BYTES)
            got = await self._read_into(view[filled : filled + want])
            filled += got
            self._total += got
            if got < want:
                raise WireError(400, f"truncated tensor: got {filled} of {nbytes} bytes")
        while filled < nbytes:
            if checker is not None:
                checker.advance(filled)
            chunk = await self._read_any()
            if not chunk:
                raise WireError(400, f"truncated tensor: got {filled} of {nbytes} bytes")
            self._total += len(chunk)
            if self._total > self._max_total:
                raise WireError(413, f"body exceeds the limit of {self._max_total} bytes")
            take = min(len(chunk), nbytes - filled)
            view[filled : filled + take] = chunk[:take]
            filled += take
            if take < len(chunk):
                raise WireError(400, "trailing bytes after the tensor")
        await self.end()
        if checker is not None:
            self.finite = checker.finish()
        return out

    async def end(self) -> None:
        if self._pending or await self._read_any():
            raise WireError(400, "trailing bytes after the message")
