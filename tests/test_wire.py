"""Framing: round trips and the errors a receiver must raise."""

from __future__ import annotations

import msgpack
import pytest
import torch

from asyncsync.protocols.base import all_finite
from asyncsync.wire.frames import (
    MAX_HEADER_BYTES,
    PREFIX,
    FrameReader,
    Limits,
    WireError,
    encode_header,
    tensor_chunks,
    tensor_spec,
)


def reader_over(data: bytes, chunk: int = 7, limit: int = 1 << 20) -> FrameReader:
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]

    async def read_any() -> bytes:
        return pieces.pop(0) if pieces else b""

    return FrameReader(read_any, limit)


def frame(header: dict, tensor: torch.Tensor | None) -> bytes:
    body = b"".join(bytes(p) for p in tensor_chunks(tensor, 16)) if tensor is not None else b""
    return encode_header(header, tensor) + body


async def test_round_trip_in_small_chunks() -> None:
    vector = torch.arange(10, dtype=torch.float32)
    reader = reader_over(frame({"worker": 1}, vector))
    header = await reader.header()
    assert header["worker"] == 1
    nbytes = tensor_spec(header, Limits(10))
    assert nbytes == 40
    out = await reader.tensor(nbytes, torch.float32)
    assert torch.equal(out, vector)


async def test_truncated_tensor_is_rejected() -> None:
    data = frame({}, torch.ones(10))[:-5]
    reader = reader_over(data)
    header = await reader.header()
    with pytest.raises(WireError, match="truncated") as err:
        await reader.tensor(tensor_spec(header, Limits(10)) or 0, torch.float32)
    assert err.value.status == 400


async def test_trailing_bytes_are_rejected() -> None:
    reader = reader_over(frame({}, torch.ones(4)) + b"xx")
    header = await reader.header()
    with pytest.raises(WireError, match="trailing"):
        await reader.tensor(tensor_spec(header, Limits(4)) or 0, torch.float32)


async def test_oversized_header_and_body() -> None:
    huge = PREFIX.pack(MAX_HEADER_BYTES + 1) + b"\x80"
    with pytest.raises(WireError) as err:
        await reader_over(huge).header()
    assert err.value.status == 413
    reader = reader_over(frame({}, torch.ones(100)), limit=64)
    header = await reader.header()
    with pytest.raises(WireError) as err:
        await reader.tensor(tensor_spec(header, Limits(100)) or 0, torch.float32)
    assert err.value.status == 413


@pytest.mark.parametrize(
    ("spec", "status", "match"),
    [
        ({"dtype": "float64", "shape": [4]}, 422, "dtype"),
        ({"dtype": "float32", "shape": [5]}, 422, "shape"),
        ({"dtype": "float32", "shape": [2, 2]}, 422, "shape"),
        ("float32", 400, "map"),
    ],
)
def test_tensor_spec_checks(spec: object, status: int, match: str) -> None:
    with pytest.raises(WireError, match=match) as err:
        tensor_spec({"tensor": spec}, Limits(4))
    assert err.value.status == status


async def test_header_must_be_a_map() -> None:
    raw = msgpack.packb([1, 2, 3])
    with pytest.raises(WireError, match="map"):
        await reader_over(PREFIX.pack(len(raw)) + raw).header()
    with pytest.raises(WireError, match="malformed"):
        await reader_over(PREFIX.pack(3) + b"\xc1\xc1\xc1").header()


def test_tensor_chunks_do_not_copy() -> None:
    vector = torch.zeros(8)
    piece = next(tensor_chunks(vector, 1 << 20))
    vector[0] = 5.0
    assert bytes(piece[:4]) == torch.tensor([5.0]).numpy().tobytes()


@pytest.mark.parametrize("bad_at", [None, 0, 70_000, 150_000, 199_999])
async def test_finiteness_is_checked_slice_by_slice_while_the_body_arrives(
        bad_at: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """200k floats arrive in 10 kB reads: NaN or Inf anywhere (first slice, a middle one,
    the very last element) is found, and slices are checked before the body has ended."""
    import asyncsync.wire.frames as wire

    vector = torch.linspace(-1.0, 1.0, 200_000)
    if bad_at is not None:
        vector[bad_at] = float("nan") if bad_at % 2 else float("inf")
    data = frame({}, vector)
    delivered = [0]
    checked_at: list[int] = []
    pieces = [data[i : i + 10_000] for i in range(0, len(data), 10_000)]

    async def read_any() -> bytes:
        piece = pieces.pop(0) if pieces else b""
        delivered[0] += len(piece)
        return piece

    def recording(part: torch.Tensor) -> bool:
        checked_at.append(delivered[0])
        return all_finite(part)

    monkeypatch.setattr(wire, "all_finite", recording)
    reader = FrameReader(read_any, 1 << 22)
    header = await reader.header()
    out = await reader.tensor(tensor_spec(header, Limits(200_000)) or 0, torch.float32,
                              check_finite=True)
    assert torch.equal(out.isfinite(), vector.isfinite())
    assert reader.finite is (bad_at is None)
    assert checked_at and checked_at[0] < len(data), "checked while arriving"


async def test_without_the_check_finite_is_unknown() -> None:
    reader = reader_over(frame({}, torch.full((4,), float("nan"))))
    header = await reader.header()
    await reader.tensor(tensor_spec(header, Limits(4)) or 0, torch.float32)
    assert reader.finite is None


class Source:
    """A byte stream read in chunks of `chunk` or, with `read_into`, into a caller's view."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        self.data = memoryview(data)
        self.at = 0
        self.chunk = chunk
        self.into = 0  # bytes delivered by read_into

    async def read_any(self) -> bytes:
        piece = bytes(self.data[self.at : self.at + self.chunk])
        self.at += len(piece)
        return piece

    async def read_into(self, view: memoryview) -> int:
        got = len(self.data[self.at : self.at + len(view)])
        view[:got] = self.data[self.at : self.at + got]
        self.at += got
        self.into += got
        return got


@pytest.mark.parametrize("chunk", [7, 1 << 16])
async def test_read_into_receives_the_tensor_in_place(chunk: int) -> None:
    vector = torch.linspace(-3.0, 3.0, 300_000)
    source = Source(frame({"worker": 2}, vector), chunk)
    reader = FrameReader(source.read_any, 1 << 22, source.read_into)
    header = await reader.header()
    out = await reader.tensor(tensor_spec(header, Limits(300_000)) or 0, torch.float32)
    assert torch.equal(out, vector) and header["worker"] == 2
    assert source.into >= vector.nbytes - chunk, "the tensor's bytes came by read_into"


async def test_read_into_truncated_tensor_is_rejected() -> None:
    source = Source(frame({}, torch.ones(100_000))[:-5])
    reader = FrameReader(source.read_any, 1 << 22, source.read_into)
    header = await reader.header()
    with pytest.raises(WireError, match="truncated") as err:
        await reader.tensor(tensor_spec(header, Limits(100_000)) or 0, torch.float32)
    assert err.value.status == 400


@pytest.mark.parametrize("bad_at", [None, 3, 150_000, 299_999])
async def test_read_into_checks_finite(bad_at: int | None) -> None:
    vector = torch.linspace(-1.0, 1.0, 300_000)
    if bad_at is not None:
        vector[bad_at] = float("nan")
    source = Source(frame({}, vector))
    reader = FrameReader(source.read_any, 1 << 22, source.read_into)
    header = await reader.header()
    out = await reader.tensor(tensor_spec(header, Limits(300_000)) or 0, torch.float32,
                              check_finite=True)
    assert torch.equal(out.isfinite(), vector.isfinite())
    assert reader.finite is (bad_at is None)
