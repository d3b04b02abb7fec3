"""Seeded mutations of valid frames of every operation, over both channels (a POST each,
and frames on an upgraded stream): a field set to a value of the wrong type, out of range,
non-finite or nested; a field dropped; a tensor descriptor or codec that lies; bytes
flipped, cut or added; a NaN slipped into the tensor. Every reply is a 200 or a 4xx with a
one-line reason (never a 5xx); a refused request leaves the model and its version exactly
as they were, and the model stays finite."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import StreamConnection
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire import codecs
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header
from tests.helpers import tiny_model

RUN = "mutations"
SEED = 8
REQUESTS = 400
"""Per channel (a few seconds each)."""
WITHIN_S = 30.0


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = [0]
    for _ in range(depth):
        value = [value]
    return value


HOSTILE: list[Any] = [
    None, True, False, -1, 2**63, 2**64 - 1, -2**63, 0.5, math.nan, math.inf, -math.inf,
    1e308, "", "x" * 300, "gradient", b"\x00\xff", [], [1, 2], {}, {"a": {"b": [1]}},
    deep_list(500), msgpack.ExtType(7, b"ab"), msgpack.Timestamp(1, 0), "é" * 40,
]
"""Values a field may be set to: wrong types, out of range, non-finite, nested."""
FIELDS = ["worker", "run_id", "session", "base_version", "kind", "steps", "samples", "meta",
          "stats", "then_pull", "codec", "tensor"]

Frame = tuple[str, dict[str, Any], bytes]
"""An operation, its header (with its tensor descriptor) and its tensor's bytes."""


def valid_frames(secret: str, version: int, numel: int, rng: random.Random) -> list[Frame]:
    """One well-formed request of each kind, as worker 0 with its session secret."""
    me = {"worker": 0, "run_id": RUN, "session": secret}
    push = {**me, "base_version": version, "kind": "gradient", "steps": 1, "samples": 4}
    gradient = torch.randn(numel, generator=torch.Generator().manual_seed(
        rng.randrange(2**31))) * 1e-3
    frames: list[Frame] = [
        ("join", dict(me), b""), ("pull", {**me, "base_version": version}, b""),
        ("heartbeat", {**me, "stats": {"steps": 1}}, b""), ("status", {}, b""),
        ("query", {**me, "meta": {}}, b""),
        ("push", {**push, "tensor": {"dtype": "float32", "shape": [numel]}},
         gradient.numpy().tobytes()),
        ("push", {**push, "then_pull": True,
                  "tensor": {"dtype": "float32", "shape": [numel]}}, gradient.numpy().tobytes()),
    ]
    for name in ("topk", "int8", "float16"):
        payload, codec = codecs.encode(name, gradient, 0.1)
        frames.append(("push", {**push, "codec": codec,
                                "tensor": {"dtype": "uint8", "shape": [payload.numel()]}},
                       payload.numpy().tobytes()))
    return frames


def mutate(frame: Frame, rng: random.Random) -> tuple[str, bytes]:
    """`frame`, changed in one to three ways, as (op, body bytes)."""
    op, header, tensor = frame[0], dict(frame[1]), frame[2]
    if rng.random() < 0.1:
        op = rng.choice(["push", "pull", "join", "leave", "stop-", "", "PUSH", "push\x00"])
    for _ in range(rng.randrange(1, 4)):
        way = rng.randrange(6)
        if way == 0:
            header[rng.choice(FIELDS)] = rng.choice(HOSTILE)
        elif way == 1:
            header.pop(rng.choice(FIELDS), None)
        elif way == 2 and isinstance(header.get("tensor"), dict):
            spec = dict(header["tensor"])
            spec[rng.choice(["dtype", "shape"])] = rng.choice(
                [*HOSTILE, "float64", "int8", [len(tensor) // 4 + 1], [0], [-1], [1, 1]])
            header["tensor"] = spec
        elif way == 3 and isinstance(header.get("codec"), dict):
            codec = dict(header["codec"])
            codec[rng.choice(["name", "numel", "k", "raw"])] = rng.choice(
                [*HOSTILE, "topk", "int8", 0, 1, 10**9])
            header["codec"] = codec
        elif way == 4 and tensor:
            at = rng.randrange(0, len(tensor) - 3, 4) if len(tensor) > 4 else 0
            tensor = tensor[:at] + rng.choice([b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f",
                                               b"\xff\xff\xff\xff"]) + tensor[at + 4:]
        elif way == 5:
            header[rng.choice(["meta", "stats"])] = {
                rng.choice(["fragment", "part", "iteration", "compute_s", "steps", "x"]):
                    rng.choice(HOSTILE)}
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        packed = msgpack.packb({"run_id": RUN}, use_bin_type=True)
    body = PREFIX.pack(len(packed)) + packed + tensor
    if rng.random() < 0.3:  # and the bytes themselves
        raw = bytearray(body)
        cut = rng.randrange(6)
        if cut == 0:
            raw = raw[:rng.randrange(len(raw))]
        elif cut == 1:
            raw += rng.randbytes(rng.randrange(1, 64))
        elif cut == 2:
            raw[:PREFIX.size] = PREFIX.pack(rng.choice([0, 1, len(packed) + 1, 2**31, 2**32 - 1]))
        else:
            for _ in range(rng.randrange(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        body = bytes(raw)
    return op, body


def session_in(reply: bytes) -> str | None:
    """The session secret a join's reply frame gives, if it is one."""
    (size,) = PREFIX.unpack(reply[:PREFIX.size])
    meta = decode_header(reply[PREFIX.size:PREFIX.size + size]).get("meta", {})
    return meta.get("session") if isinstance(meta, dict) else None


Send = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]


async def attack(server: ParameterServer, send: Send) -> Counter[int]:
    """Send `REQUESTS` mutants through `send`; check every reply and the model after it."""
    rng = random.Random(SEED)
    store = server.core.store
    status, reply = await send("join", encoded({"worker": 0, "run_id": RUN}))
    assert status == 200
    secret = session_in(reply)
    assert secret
    statuses: Counter[int] = Counter()
    for number in range(REQUESTS):
        frames = valid_frames(secret, store.version, store.numel, rng)
        op, body = mutate(rng.choice(frames), rng)
        version, model = store.version, store.w.clone()
        status, reply = await send(op, body)
        statuses[status] += 1
        where = f"request {number}: {op!r} {body[:120]!r} -> {status} {reply[:200]!r}"
        assert status == 200 or 400 <= status < 500, where
        if status != 200:
            reason = reply.decode("utf-8", "replace").strip()
            assert reason and "\n" not in reason, where
            assert store.version == version and torch.equal(store.w, model), where
        elif op == "join":
            secret = session_in(reply) or secret
        elif op != "push":
            assert store.version == version and torch.equal(store.w, model), where
        assert bool(torch.isfinite(store.w).all()), where
        if 0 not in store.live:  # a mutant made it leave: join again to reach further
            status, reply = await send("join", encoded({"worker": 0, "run_id": RUN}))
            secret = session_in(reply) or secret
    return statuses


def encoded(header: dict[str, Any]) -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(len(packed)) + packed


def check_spread(statuses: Counter[int]) -> None:
    """The mutants reached both outcomes: some were well formed enough to be applied, and
    refusals of several kinds came back (else the checks above could not have failed)."""
    assert statuses[200] >= REQUESTS // 20, statuses
    assert len([s for s in statuses if 400 <= s < 500]) >= 4, statuses
    assert sum(n for s, n in statuses.items() if s >= 400) >= REQUESTS // 2, statuses


async def test_mutated_posts_get_a_200_or_a_4xx_and_refusals_change_nothing() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WITHIN_S)) as session:

        async def post(op: str, body: bytes) -> tuple[int, bytes]:
            async with session.post(f"{server.url}/v1/{op}", data=body,
                                    headers={"Content-Type": CONTENT_TYPE}) as resp:
                return resp.status, await resp.read()

        check_spread(await attack(server, post))


async def test_mutated_stream_frames_get_a_200_or_a_4xx_and_refusals_change_nothing() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN)) as server:
        streams: list[StreamConnection] = []

        async def send(op: str, body: bytes) -> tuple[int, bytes]:
            if not streams or not streams[0].reusable:
                if streams:
                    streams.pop().close()
                streams.append(await StreamConnection.open(server.url, None, None, None))
            stream = streams[0]

            async def pieces() -> Any:
                yield body

            name = op.encode("ascii", "replace")[:32] or b"?"
            await stream.send(name.decode("ascii"), len(body), pieces())
            status, length = await asyncio.wait_for(stream.reply(), WITHIN_S)
            return status, await stream.receiver.read_exactly(length)

        try:
            check_spread(await attack(server, send))
        finally:
            for stream in streams:
                stream.close()
