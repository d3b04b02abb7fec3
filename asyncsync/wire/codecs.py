"""Compressed pushes: the codecs a worker may apply to the gradients and deltas it pushes.

A compressed vector travels as the message's tensor, a uint8 tensor of the encoded bytes,
with the header field ``codec = {"name": NAME, "numel": N}`` (top-k adds ``"k"``); the
server decodes it back to N float32 values and then validates it like any push (shape,
finiteness, the rule's checks). Pushes of kind "model", pulls and replies are never
compressed. Codecs, and their bytes per element of an N-element vector:

- ``none``: float32 as today, 4 bytes (no codec field).
- ``float16``: IEEE half precision, 2 bytes; finite values beyond +-65504 are clamped to
  it (Inf stays Inf, so a diverged worker's push is refused, as uncompressed).
- ``bfloat16``: float32's range with an 8-bit mantissa, 2 bytes.
- ``int8``: symmetric quantization per chunk of `INT8_CHUNK` elements: one float32 scale
  (the chunk's max |v| / 127) per chunk, then one int8 per element: 1 + 4 / 4096 bytes. A
  chunk holding NaN or Inf gets a non-finite scale, and decodes to non-finite values.
  Layout: all scales, then all int8 values.
- ``topk``: the k = ceil(fraction x N) entries largest in |v|: k int32 indices (strictly
  increasing) then their k float32 values: 8 x fraction bytes. Layout: indices, values.

Buffer slots (BatchNorm statistics, the tail of a whole-model vector after its
parameters) are values the server adopts, not steps it sums: they travel uncompressed. The
descriptor then says ``"raw": B``, and the payload starts with the last B elements as
float32 (4 B bytes), followed by the codec's bytes for the first N - B elements; so top-k
never spends its k entries on statistics (nor drops one, which would be adopted as 0), and
int8 never shares a scale between statistics and small gradients.

Error feedback (on by default, for every codec): the worker keeps, per push kind, the
residual r = (v + r) - decode(encode(v + r)) of the parameter part, i.e. what the last push
of that kind did not carry, and adds it to the next push of the same kind (buffer slots,
sent exactly, have none). Only whole-model vectors take part:
a fragment (e.g. streaming DiLoCo's) is compressed without feedback, since fragments of
one kind cover different parts of the model. The residual assumes the push was applied; a
rejoin (a new session) clears it, since the worker restarts from the global model.

A malformed payload (unknown codec, wrong length, indices out of range or not increasing,
negative scales) is refused with `BadRequest` or `Unacceptable` (4xx); one that decodes to
NaN or Inf is refused by the server's finiteness check, as an uncompressed push would be.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from asyncsync.protocols.base import BadRequest, Unacceptable, all_finite

CODECS = ("none", "float16", "bfloat16", "topk", "int8")
COMPRESSED_KINDS = frozenset({"gradient", "delta"})
"""The push kinds a worker compresses; "model" pushes go uncompressed."""
INT8_CHUNK = 4096
"""Elements per int8 scale."""
FLOAT16_MAX = torch.finfo(torch.float16).max
_HALVES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def topk_count(numel: int, fraction: float) -> int:
    """How many entries top-k keeps of `numel` (at least one)."""
    return max(1, min(numel, math.ceil(fraction * numel)))


def payload_bytes(codec: object, numel: int) -> int:
    """The length of a payload described by header field `codec` for a vector of `numel`
    elements; raises `BadRequest` for a malformed or mismatched descriptor."""
    if not isinstance(codec, dict):
        raise BadRequest("'codec' must be a map with name and numel")
    name, count = codec.get("name"), codec.get("numel")
    if name not in CODECS or name == "none":
        raise BadRequest(f"unknown codec {str(name)[:40]!r}: expected one of "
                         f"{', '.join(CODECS[1:])}")
    if count != numel or isinstance(count, bool):
        raise BadRequest(f"codec numel {str(count)[:40]} does not match the expected {numel}")
    raw = codec.get("raw", 0)
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw < numel:
        raise BadRequest(f"codec raw must be an integer in 0..{numel - 1}, got {str(raw)[:40]}")
    return 4 * raw + _coded_bytes(name, codec, numel - raw)


def _coded_bytes(name: object, codec: dict[Any, Any], numel: int) -> int:
    """The length of the codec's part of a payload, for `numel` coded elements."""
    if name in _HALVES:
        return 2 * numel
    if name == "int8":
        return numel + 4 * math.ceil(numel / INT8_CHUNK)
    k = codec.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= numel:
        raise BadRequest(f"topk: k must be an integer in 1..{numel}, got {str(k)[:40]}")
    return 8 * k


def encode(name: str, vector: torch.Tensor, fraction: float = 0.01
           ) -> tuple[torch.Tensor, dict[str, Any]]:
    """Encode a float32 `vector` with codec `name`: the uint8 payload and its descriptor."""
    flat = vector.detach().reshape(-1).to(torch.float32)
    descriptor: dict[str, Any] = {"name": name, "numel": flat.numel()}
    if name in _HALVES:
        if name == "float16":  # Inf stays Inf: the server refuses it, as uncompressed
            flat = torch.where(flat.isinf(), flat, flat.clamp(-FLOAT16_MAX, FLOAT16_MAX))
        return flat.to(_HALVES[name]).view(torch.uint8), descriptor
    if name == "int8":
        chunks = math.ceil(flat.numel() / INT8_CHUNK)
        padded = torch.zeros(chunks * INT8_CHUNK)
        padded[: flat.numel()] = flat
        scales = padded.view(chunks, INT8_CHUNK).abs().amax(dim=1) / 127
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        levels = (padded.view(chunks, INT8_CHUNK) / safe[:, None]).round().clamp(-127, 127)
        values = levels.reshape(-1)[: flat.numel()].to(torch.int8)
        return torch.cat([scales.view(torch.uint8), values.view(torch.uint8)]), descriptor
    if name == "topk":
        k = topk_count(flat.numel(), fraction)
        indices = flat.abs().topk(k, sorted=False).indices.sort().values.to(torch.int32)
        descriptor["k"] = k
        return torch.cat([indices.view(torch.uint8), flat[indices].view(torch.uint8)]), descriptor
    raise ValueError(f"unknown codec {name!r}: expected one of {', '.join(CODECS[1:])}")


def encode_split(name: str, vector: torch.Tensor, raw: int, fraction: float = 0.01
                 ) -> tuple[torch.Tensor, dict[str, Any]]:
    """`encode` the first N - `raw` elements of `vector`; the last `raw` (buffer slots)
    travel as float32 ahead of them (see the module's layout)."""
    if not raw:
        return encode(name, vector, fraction)
    flat = vector.detach().reshape(-1).to(torch.float32)
    coded, descriptor = encode(name, flat[:-raw], fraction)
    descriptor.update(numel=flat.numel(), raw=raw)
    return torch.cat([flat[-raw:].contiguous().view(torch.uint8), coded]), descriptor


def decode(codec: object, payload: torch.Tensor, numel: int) -> torch.Tensor:
    """The float32 vector of `numel` elements a payload encodes; refuses malformed ones."""
    size = payload_bytes(codec, numel)
    if payload.dtype != torch.uint8 or payload.shape != (size,):
        raise Unacceptable(f"compressed payload of {payload.numel()} {payload.dtype} elements: "
                           f"expected {size} bytes")
    assert isinstance(codec, dict)  # payload_bytes checked it
    raw = int(codec.get("raw", 0))
    if not raw:
        return _decode_coded(codec, payload, numel)
    coded = _decode_coded(codec, payload[4 * raw :], numel - raw)
    return torch.cat([coded, payload[: 4 * raw].view(torch.float32)])


def _decode_coded(codec: dict[str, Any], payload: torch.Tensor, numel: int) -> torch.Tensor:
    """Decode the codec's part of a payload (its length already checked)."""
    name = codec["name"]
    if name in _HALVES:
        return payload.view(_HALVES[name]).to(torch.float32)
    if name == "int8":
        chunks = math.ceil(numel / INT8_CHUNK)
        scales = payload[: 4 * chunks].view(torch.float32)
        if bool((scales < 0).any()):  # a NaN or Inf scale decodes to non-finite values,
            raise Unacceptable("int8 payload: scales must be >= 0")  # refused as such
        values = payload[4 * chunks :].view(torch.int8).to(torch.float32)
        return values * scales.repeat_interleave(INT8_CHUNK)[:numel]
    k = int(codec["k"])
    indices = payload[: 4 * k].view(torch.int32).to(torch.int64)
    if not (int(indices[0]) >= 0 and int(indices[-1]) < numel
            and bool((indices[1:] > indices[:-1]).all())):
        raise Unacceptable("topk payload: indices must be strictly increasing in "
                           f"0..{numel - 1}")
    out = torch.zeros(numel)
    out[indices] = payload[4 * k :].view(torch.float32)
    return out


class Compressor:
    """A worker's codec for its pushes, with its error-feedback residuals (see the module).

    Args:
        name: one of `CODECS` other than "none".
        topk_fraction: the share of entries top-k keeps, in (0, 1].
        error_feedback: keep each push kind's residual and add it to its next push.
    """

    def __init__(self, name: str, topk_fraction: float = 0.01,
                 error_feedback: bool = True) -> None:
        if name not in CODECS or name == "none":
            raise ValueError(f"unknown codec {name!r}: expected one of {', '.join(CODECS[1:])}")
        if not 0 < topk_fraction <= 1:
            raise ValueError(f"topk_fraction must be in (0, 1], got {topk_fraction}")
        self.name = name
        self.topk_fraction = topk_fraction
        self.error_feedback = error_feedback
        self.residuals: dict[str, torch.Tensor] = {}
        self._session: str | None = None

    def encode(self, kind: str, vector: torch.Tensor, session: str, whole: bool = True,
               buffers: int = 0) -> tuple[torch.Tensor, dict[str, Any]]:
        """The payload and descriptor for a push of `kind` in worker session `session`
        (a new session clears the residuals); `whole`: the vector is the whole model's
        (only such pushes take part in error feedback), whose last `buffers` elements are
        buffer slots (sent uncompressed)."""
        if session != self._session:
            self.residuals.clear()
            self._session = session
        raw = buffers if whole and 0 < buffers < vector.numel() else 0
        coded = vector.numel() - raw
        residual = self.residuals.get(kind) if whole else None
        target = vector
        if residual is not None and residual.numel() == coded:
            target = vector.clone()
            target[:coded] += residual
        payload, descriptor = encode_split(self.name, target, raw, self.topk_fraction)
        if self.error_feedback and whole:
            residual = target[:coded] - decode(descriptor, payload, target.numel())[:coded]
            if all_finite(residual):  # a non-finite push is refused; do not carry it on
                self.residuals[kind] = residual
            else:
                self.residuals.pop(kind, None)
        return payload, descriptor
