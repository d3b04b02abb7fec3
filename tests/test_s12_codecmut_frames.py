"""Framing limits at their exact boundaries, and tensor descriptors a reply may not have
(session 12's mutation testing found them unguarded). Sizes are hand-computed."""

from __future__ import annotations

import pytest
import torch

from asyncsync.wire.frames import (
    MAX_HEADER_BYTES,
    PREFIX,
    FrameReader,
    Limits,
    WireError,
    encode_header,
    encode_reply,
    tensor_spec,
)


def padded(size: int) -> dict[str, str]:
    """A header that msgpack packs into `size` bytes: a one-entry map (1 byte), the key
    "pad" (1 + 3 bytes) and a str16 value (3 bytes + its length)."""
    return {"pad": "x" * (size - 8)}


def reader_of(data: bytes, limit: int) -> FrameReader:
    pieces = [data[i : i + 4096] for i in range(0, len(data), 4096)]

    async def read_any() -> bytes:
        return pieces.pop(0) if pieces else b""

    return FrameReader(read_any, limit)


def test_the_largest_body_is_the_prefix_the_largest_header_and_the_tensor() -> None:
    assert MAX_HEADER_BYTES == 65536 and PREFIX.size == 4
    assert Limits(0).max_body_bytes == 4 + 65536
    assert Limits(10).max_body_bytes == 4 + 65536 + 40


async def test_a_header_of_exactly_the_limit_is_sent_and_read_within_the_body_limit() -> None:
    data = encode_header(padded(MAX_HEADER_BYTES), None)
    assert len(data) == 4 + 65536
    header = await reader_of(data, Limits(0).max_body_bytes).header()
    assert header == padded(MAX_HEADER_BYTES)
    with pytest.raises(ValueError, match="exceeds"):
        encode_header(padded(MAX_HEADER_BYTES + 1), None)


async def test_a_header_one_byte_over_the_limit_is_refused_413() -> None:
    data = PREFIX.pack(MAX_HEADER_BYTES + 1) + b"\x80" * (MAX_HEADER_BYTES + 1)
    with pytest.raises(WireError, match="header of 65537 bytes") as err:
        await reader_of(data, 1 << 20).header()
    assert err.value.status == 413


async def test_a_body_one_byte_over_its_limit_is_refused_and_one_at_it_is_read() -> None:
    data = encode_header({"worker": 1}, torch.ones(3)) + torch.ones(3).numpy().tobytes()
    reader = reader_of(data, len(data))
    header = await reader.header()
    assert torch.equal(await reader.tensor(12, torch.float32), torch.ones(3))
    reader = reader_of(data, len(data) - 1)
    with pytest.raises(WireError, match=f"limit of {len(data) - 1} bytes") as err:
        await reader.tensor(tensor_spec(await reader.header(), Limits(3)) or 0, torch.float32)
    assert err.value.status == 413 and header["worker"] == 1


@pytest.mark.parametrize(("spec", "codec", "status", "match"), [
    ({"dtype": "float32", "shape": [0]}, None, 422, "shape"),  # an empty fragment
    ({"dtype": "float32", "shape": [True]}, None, 422, "shape"),
    ({"dtype": "float32", "shape": [5]}, None, 422, "shape"),  # more than the model
    ({"dtype": "uint8", "shape": [4]}, None, 422, "dtype"),  # bytes without a codec
    ({"dtype": "uint8", "shape": [8]}, {"name": "float16", "numel": 4}, 400, "never compressed"),
])
def test_a_reply_tensor_must_be_a_float32_fragment_of_the_model(
        spec: dict[str, object], codec: dict[str, object] | None, status: int,
        match: str) -> None:
    header: dict[str, object] = {"tensor": spec}
    if codec is not None:
        header["codec"] = codec
    with pytest.raises(WireError, match=match) as err:
        tensor_spec(header, Limits(4), up_to=True)
    assert err.value.status == status
    assert tensor_spec({"tensor": {"dtype": "float32", "shape": [4]}}, Limits(4), True) == 16
    assert tensor_spec({"tensor": {"dtype": "float32", "shape": [1]}}, Limits(4), True) == 4


def test_an_uncompressed_push_of_bytes_is_refused_422() -> None:
    with pytest.raises(WireError, match="wrong dtype 'uint8'") as err:
        tensor_spec({"tensor": {"dtype": "uint8", "shape": [16]}}, Limits(4))
    assert err.value.status == 422


def test_a_reply_meta_int_beyond_64_bits_is_named_in_a_500() -> None:
    with pytest.raises(WireError, match="'big' is an int beyond 64 bits") as err:
        encode_reply({"meta": {"big": 2**64}}, None, "asp", "push")
    assert err.value.status == 500


def test_the_ints_at_msgpacks_ends_are_not_blamed_for_another_keys_fault() -> None:
    meta = {"set": {1}, "low": -(2**63), "high": 2**64 - 1}  # "high" is looked at first
    with pytest.raises(WireError, match="'set' is a set") as err:
        encode_reply({"meta": meta}, None, "asp", "query")
    assert err.value.status == 500
