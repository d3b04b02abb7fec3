"""Compressed pushes: codec round trips, bytes on the wire, error feedback's effect on
training, the recipe keys, and a compressed push over HTTP."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.compute import InlineServerSeam, VirtualWorkerSeam
from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import FixedStepCost, StepDelay
from asyncsync.protocols.base import BadRequest, Unacceptable
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.codecs import INT8_CHUNK, Compressor, decode, encode, payload_bytes
from tests.helpers import STEP_S, batches_of, run_workers

NUMEL = 3 * INT8_CHUNK + 100  # several int8 chunks, the last one partial


def sample(numel: int = NUMEL, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(("name", "dtype"), [("float16", torch.float16),
                                             ("bfloat16", torch.bfloat16)])
def test_half_precision_round_trip_within_the_dtype_precision(name: str,
                                                              dtype: torch.dtype) -> None:
    v = sample()
    payload, codec = encode(name, v)
    assert payload.dtype == torch.uint8 and payload.numel() == 2 * NUMEL
    out = decode(codec, payload, NUMEL)
    assert torch.allclose(out, v, rtol=torch.finfo(dtype).eps, atol=0)
    assert not torch.equal(out, v)  # the codec is lossy: the check above has a margin to lose


def test_float16_clamps_instead_of_overflowing() -> None:
    payload, codec = encode("float16", torch.tensor([1e6, -1e6, 1.0]))
    assert decode(codec, payload, 3).tolist() == [65504.0, -65504.0, 1.0]


def test_int8_round_trip_within_a_scale_step_per_chunk() -> None:
    v = sample()
    v[INT8_CHUNK : 2 * INT8_CHUNK] *= 100  # chunks have their own scales
    v[2 * INT8_CHUNK : 3 * INT8_CHUNK] = 0  # an all-zero chunk decodes to zeros
    payload, codec = encode("int8", v)
    chunks = math.ceil(NUMEL / INT8_CHUNK)
    assert payload.numel() == NUMEL + 4 * chunks
    out = decode(codec, payload, NUMEL)
    for c in range(chunks):
        part = slice(c * INT8_CHUNK, (c + 1) * INT8_CHUNK)
        step = float(v[part].abs().max()) / 127
        assert float((out[part] - v[part]).abs().max()) <= step / 2 * (1 + 1e-5)
    assert torch.equal(out[2 * INT8_CHUNK : 3 * INT8_CHUNK], torch.zeros(INT8_CHUNK))


def test_topk_keeps_the_largest_entries_exactly() -> None:
    v = sample()
    payload, codec = encode("topk", v, fraction=0.01)
    k = math.ceil(0.01 * NUMEL)
    assert codec["k"] == k and payload.numel() == 8 * k
    out = decode(codec, payload, NUMEL)
    kept = v.abs().topk(k).indices
    assert torch.equal(out[kept], v[kept])
    assert int((out != 0).sum()) == k
    assert float(v.abs()[out == 0].max()) <= float(v.abs()[kept].min())


def test_error_feedback_carries_the_residual_per_kind_and_a_new_session_clears_it() -> None:
    v = sample(1000)
    codec = Compressor("topk", topk_fraction=0.01)
    first, desc = codec.encode("gradient", v, "s1")
    sent = decode(desc, first, 1000)
    assert torch.equal(codec.residuals["gradient"], v - sent)
    second, _ = codec.encode("gradient", v, "s1")
    assert torch.equal(second, encode("topk", v + (v - sent))[0])
    codec.encode("delta", v, "s1")
    assert set(codec.residuals) == {"gradient", "delta"}
    again, desc = codec.encode("gradient", v, "s2")  # rejoined: starts afresh
    assert torch.equal(again, first)
    assert set(codec.residuals) == {"gradient"}


def test_fragments_take_no_part_in_error_feedback() -> None:
    codec = Compressor("topk")
    codec.encode("delta", sample(1000), "s")
    kept = codec.residuals["delta"].clone()
    part, _ = codec.encode("delta", sample(100), "s", whole=False)
    assert torch.equal(part, encode("topk", sample(100))[0])
    assert torch.equal(codec.residuals["delta"], kept)


def test_without_error_feedback_nothing_is_kept() -> None:
    codec = Compressor("int8", error_feedback=False)
    first, _ = codec.encode("gradient", sample(), "s")
    second, _ = codec.encode("gradient", sample(), "s")
    assert not codec.residuals and torch.equal(first, second)


@pytest.mark.parametrize(("codec", "payload", "error"), [
    ({"name": "float16", "numel": 10}, torch.zeros(19, dtype=torch.uint8), Unacceptable),
    ({"name": "float16", "numel": 10}, torch.zeros(5), Unacceptable),
    ({"name": "topk", "numel": 10, "k": 1},
     torch.cat([torch.tensor([10], dtype=torch.int32).view(torch.uint8),
                torch.ones(1).view(torch.uint8)]), Unacceptable),
    ({"name": "topk", "numel": 10}, torch.zeros(8, dtype=torch.uint8), BadRequest),
    ({"name": "int8", "numel": 10},
     torch.cat([torch.tensor([-1.0]).view(torch.uint8), torch.zeros(10, dtype=torch.uint8)]),
     Unacceptable),
    ({"name": "none", "numel": 10}, torch.zeros(40, dtype=torch.uint8), BadRequest),
    ("float16", torch.zeros(20, dtype=torch.uint8), BadRequest),
])
def test_malformed_payloads_are_refused(codec: object, payload: torch.Tensor,
                                        error: type[Exception]) -> None:
    with pytest.raises(error):
        decode(codec, payload, 10)


def test_payload_sizes() -> None:
    n = 1_000_000
    assert payload_bytes({"name": "float16", "numel": n}, n) == 2 * n
    assert payload_bytes({"name": "int8", "numel": n}, n) == n + 4 * math.ceil(n / INT8_CHUNK)
    assert payload_bytes({"name": "topk", "numel": n, "k": n // 100}, n) == 8 * n // 100


# ---- runs ------------------------------------------------------------------------------

def task(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A 4-class problem on 16 features (harder than the tiny 2-class one)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=gen)
    w = torch.randn(16, 4, generator=gen)
    return x, (x @ w).argmax(dim=1)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def run(protocol: str, codec: str, *, error_feedback: bool = True, fraction: float = 0.01,
        steps: int = 300, workers: int = 2, lr: float = 0.1
        ) -> tuple[float, list[dict[str, Any]]]:
    """Train `model` on `task` in virtual time with each worker's pushes compressed by
    `codec`; returns the final global model's loss on the task and the workers' totals."""
    x, y = task()

    async def main() -> list[dict[str, Any]]:
        core = build_core(model(), protocol, workers, ServerSettings(lr=lr),
                          seam=InlineServerSeam())
        compressors = [None if codec == "none" else Compressor(codec, fraction, error_feedback)
                       for _ in range(workers)]
        ranks = [Worker(rank, LocalTransport(core), model(), batches_of(x, y, rank), protocol,
                        lr=lr, batch_size=16, max_steps=steps, compressor=compressors[rank],
                        seam=VirtualWorkerSeam(StepDelay(0.0), FixedStepCost(STEP_S, 16)))
                 for rank in range(workers)]
        finals = await run_workers(core, ranks)
        net = model()
        torch.nn.utils.vector_to_parameters(core.store.w, net.parameters())
        with torch.no_grad():
            losses.append(float(torch.nn.functional.cross_entropy(net(x), y)))
        return finals

    losses: list[float] = []
    loop = VirtualTimeLoop()
    try:
        finals = loop.run_until_complete(main())
    finally:
        loop.close()
    return losses[0], finals


def test_topk_with_error_feedback_converges_and_without_it_does_not() -> None:
    dense, _ = run("bsp", "none")
    feedback, _ = run("bsp", "topk")
    plain, _ = run("bsp", "topk", error_feedback=False)
    start, _ = run("bsp", "none", steps=1)
    assert feedback < 1.5 * dense, (dense, feedback)
    assert plain > 2 * feedback, (feedback, plain)
    assert plain < start  # it learns, only slower


def test_deltas_are_compressed_too() -> None:
    dense, dense_finals = run("local_sgd", "none")
    int8, finals = run("local_sgd", "int8")
    assert int8 < 1.1 * dense, (dense, int8)
    assert finals[0]["bytes_up"] < 0.5 * dense_finals[0]["bytes_up"]


def test_fragment_pushes_are_compressed() -> None:
    dense, dense_finals = run("streaming_diloco", "none")
    half, finals = run("streaming_diloco", "float16")
    assert half < 1.01 * dense, (dense, half)
    assert finals[0]["bytes_up"] < 0.85 * dense_finals[0]["bytes_up"]


@pytest.mark.parametrize(("codec", "ratio"), [("float16", 0.5), ("bfloat16", 0.5),
                                              ("int8", 0.25), ("topk", 0.02)])
def test_bytes_up_shrink_by_the_codec_ratio(codec: str, ratio: float) -> None:
    _, dense = run("asp", "none", steps=20, workers=1)
    _, small = run("asp", codec, steps=20, workers=1)
    # Both runs make the same requests; pushes dominate the bytes up, headers do not.
    up, up_dense = small[0]["bytes_up"], dense[0]["bytes_up"]
    numel = sum(p.numel() for p in model().parameters())
    pushes = 20 * 4 * numel
    assert abs((up_dense - up) - (1 - ratio) * pushes) < 0.05 * pushes, (up, up_dense)


async def test_a_compressed_push_over_http_is_decoded_and_applied() -> None:
    x, y = task()
    async with ParameterServer(model(), "asp", 1, ServerSettings(lr=0.1)) as server:
        worker = Worker.connect(0, server.url, model(), batches_of(x, y, 0), "asp", lr=0.1,
                        max_steps=5, compressor=Compressor("topk", 0.05), heartbeat_s=0.5)
        await worker.run()
        assert server.core.store.version == 5
        changed = int((server.core.store.w != model_vector()).sum())
        assert 0 < changed <= 5 * math.ceil(0.05 * server.core.store.numel)
        assert worker.transport.bytes_up < 5 * 4 * server.core.store.numel


def model_vector() -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model().parameters()).detach()


def recipe(tmp_path: Path, network: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(f"[defaults.network]\n{network}\n"
                    "[[runs]]\nname = \"a\"\nprotocol = \"bsp\"\n")
    return path


@pytest.mark.parametrize(("network", "message"), [
    ('compression = "zip"', "network.compression: must be one of none, float16"),
    ('compression = "topk"\ntopk_fraction = 0.0', "topk_fraction: must be in (0, 0.5]"),
    ('compression = "topk"\ntopk_fraction = 0.9', "topk_fraction: must be in (0, 0.5]"),
    ("topk_fraction = 0.1", "topk_fraction is only used with compression = \"topk\""),
    ('compression = "int8"\nerror_feedback = 1', "error_feedback"),
])
def test_recipe_compression_keys_are_checked(tmp_path: Path, network: str,
                                             message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(recipe(tmp_path, network))


def test_recipe_compression_builds_one_codec_per_worker(tmp_path: Path) -> None:
    spec = load_recipe(recipe(tmp_path, 'compression = "topk"\ntopk_fraction = 0.05\n'
                                        "error_feedback = false")).runs[0]
    first, second = spec.network.compressor(), spec.network.compressor()
    assert first is not None and second is not None and first is not second
    assert (first.name, first.topk_fraction, first.error_feedback) == ("topk", 0.05, False)
    assert load_recipe(recipe(tmp_path, "")).runs[0].network.compressor() is None
