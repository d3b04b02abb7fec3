"""Codec edges that mutation testing found unguarded (session 12): payload lengths at their
boundaries, error feedback's residual kept exactly over several pushes, and a diverged
worker's Inf refused, not applied, under every codec. Expected values are hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import BadRequest, Unacceptable
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.codecs import Compressor, decode, encode, payload_bytes
from tests.helpers import tiny_model

INF = math.inf


@pytest.mark.parametrize(("codec", "numel", "size"), [
    ({"name": "int8", "numel": 4096}, 4096, 4096 + 4),  # one whole chunk: one scale
    ({"name": "int8", "numel": 4097}, 4097, 4097 + 8),  # one element more: a second scale
    ({"name": "topk", "numel": 5, "k": 5}, 5, 40),  # k may be all of them
    ({"name": "float16", "numel": 10, "raw": 3}, 10, 4 * 3 + 2 * 7),  # raw + coded
    ({"name": "int8", "numel": 10, "raw": 9}, 10, 4 * 9 + 1 + 4),  # the most raw allowed
])
def test_payload_lengths_at_their_boundaries(codec: dict[str, object], numel: int,
                                             size: int) -> None:
    assert payload_bytes(codec, numel) == size


@pytest.mark.parametrize(("codec", "numel", "match"), [
    ({"name": "int8", "numel": 4, "raw": 4}, 4, "raw must be"),  # nothing left to code
    ({"name": "float16", "numel": 4, "raw": True}, 4, "raw must be"),
    ({"name": "topk", "numel": 5, "k": 0}, 5, "k must be"),
    ({"name": "topk", "numel": 5, "k": True}, 5, "k must be"),
    ({"name": "none", "numel": 4}, 4, "unknown codec"),
    ({"name": "float16", "numel": True}, 1, "numel"),
])
def test_descriptors_out_of_range_are_refused_by_name(codec: dict[str, object], numel: int,
                                                      match: str) -> None:
    with pytest.raises(BadRequest, match=match):
        payload_bytes(codec, numel)


def test_int8_payload_at_a_whole_chunk_round_trips() -> None:
    vector = torch.zeros(4096)
    vector[7] = -127.0  # scale 1: every level is an integer, decoded exactly
    vector[8] = 3.0
    payload, codec = encode("int8", vector)
    assert payload.numel() == 4096 + 4
    assert torch.equal(decode(codec, payload, 4096), vector)


def test_int8_padding_of_a_partial_chunk_does_not_set_its_scale() -> None:
    vector = torch.zeros(4097)
    vector[4096] = 0.5  # alone in the second chunk: scale 0.5 / 127, level 127
    payload, codec = encode("int8", vector)
    assert torch.equal(payload[4:8].view(torch.float32), torch.tensor([0.5 / 127]))
    assert abs(float(decode(codec, payload, 4097)[4096]) - 0.5) <= 1e-7


def test_topk_with_fraction_one_sends_every_entry_exactly() -> None:
    vector = torch.tensor([0.5, -3.0, 0.0, 1e-8, 7.25])
    payload, codec = encode("topk", vector, fraction=1.0)
    assert codec["k"] == 5 and payload.numel() == 40
    assert torch.equal(decode(codec, payload, 5), vector)


@pytest.mark.parametrize("payload", [torch.zeros(20), torch.zeros(21, dtype=torch.uint8)])
def test_a_payload_of_the_wrong_dtype_or_length_is_refused(payload: torch.Tensor) -> None:
    with pytest.raises(Unacceptable, match="expected 20 bytes"):
        decode({"name": "float16", "numel": 10}, payload, 10)


def test_a_topk_fraction_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="topk_fraction"):
        Compressor("topk", topk_fraction=0.0)


def test_error_feedback_keeps_the_residual_exactly_over_pushes() -> None:
    """Top-1 of four dyadic values (sums exact in float32), by hand:
    push 1: target v     = [1, .75, -.5, .125]  sends [1, 0, 0, 0],   r = [0, .75, -.5, .125]
    push 2: target v + r = [1, 1.5, -1, .25]    sends [0, 1.5, 0, 0], r = [1, 0, -1, .25]
    push 3: target v + r = [2, .75, -1.5, .375] sends [2, 0, 0, 0],   r = [0, .75, -1.5, .375]
    so the three pushes and the last residual add up to 3 v."""
    vector = torch.tensor([1.0, 0.75, -0.5, 0.125])
    original = vector.clone()
    compressor = Compressor("topk", topk_fraction=0.25)
    sent = [[1.0, 0, 0, 0], [0, 1.5, 0, 0], [2.0, 0, 0, 0]]
    residuals = [[0, 0.75, -0.5, 0.125], [1.0, 0, -1.0, 0.25], [0, 0.75, -1.5, 0.375]]
    for expected_sent, expected_residual in zip(sent, residuals, strict=True):
        payload, codec = compressor.encode("gradient", vector, "s")
        assert decode(codec, payload, 4).tolist() == expected_sent
        assert compressor.residuals["gradient"].tolist() == expected_residual
    assert torch.equal(vector, original)  # the caller's vector is left as it was


def test_a_fragment_sends_no_raw_slots_and_keeps_no_residual() -> None:
    compressor = Compressor("topk", topk_fraction=0.25)
    fragment = torch.tensor([0.25, -4.0, 1.0, 2.0])
    payload, codec = compressor.encode("delta", fragment, "s", whole=False, buffers=2)
    assert codec == {"name": "topk", "numel": 4, "k": 1}
    assert decode(codec, payload, 4).tolist() == [0.0, -4.0, 0.0, 0.0]
    assert not compressor.residuals


def test_a_non_finite_push_drops_the_residual_so_the_next_starts_afresh() -> None:
    compressor = Compressor("topk", topk_fraction=0.25)
    compressor.encode("gradient", torch.tensor([4.0, 1.0, 0.0, 0.0]), "s")  # r = [0, 1, 0, 0]
    compressor.encode("gradient", torch.tensor([INF, 0.0, 0.0, 0.0]), "s")  # refused
    assert "gradient" not in compressor.residuals
    payload, codec = compressor.encode("gradient", torch.tensor([0.5, 0.25, 0.0, 0.0]), "s")
    assert decode(codec, payload, 4).tolist() == [0.5, 0.0, 0.0, 0.0]
    assert compressor.residuals["gradient"].tolist() == [0.0, 0.25, 0.0, 0.0]


def test_float16_keeps_inf_so_it_is_refused_but_clamps_large_finite_values() -> None:
    payload, codec = encode("float16", torch.tensor([INF, -INF, 1e6, -7e4, 1.0]))
    assert decode(codec, payload, 5).tolist() == [INF, -INF, 65504.0, -65504.0, 1.0]


@pytest.mark.parametrize("name", ["float16", "bfloat16", "int8", "topk"])
async def test_a_diverged_workers_inf_gradient_is_refused_under_every_codec(name: str) -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(lr=0.1))
    transport = LocalTransport(core)
    who = {"worker": 0, "run_id": "run"}
    reply, _ = await transport.request("join", who)
    who["session"] = reply["meta"]["session"]
    before = core.store.w.clone()
    gradient = torch.full((core.store.numel,), 0.5)
    gradient[0] = INF
    payload, codec = Compressor(name, topk_fraction=0.5).encode("gradient", gradient, "s")
    with pytest.raises(Unacceptable):
        await transport.request("push", {**who, "base_version": 0, "kind": "gradient",
                                          "steps": 1, "samples": 4, "codec": codec}, payload)
    assert torch.equal(core.store.w, before) and core.store.version == 0
    await core.close()
