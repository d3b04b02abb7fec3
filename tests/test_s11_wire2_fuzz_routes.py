"""Seeded property test of every HTTP route of a live server: hostile bodies, headers,
paths and methods, before the start, in the run (over HTTP and the stream channel) and
after the stop. Whatever the bytes,
the status is below 500, a refusal carries a one-line reason, and a refused request
leaves the model and its version bit for bit as they were."""

from __future__ import annotations

import asyncio
import random
import struct
from collections import Counter
from typing import Any

import aiohttp
import msgpack
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import PATH as STREAM_PATH
from asyncsync.transport.frame_stream import REPLY, REQUEST
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.tokens import worker_token
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "fuzz2"
TOKEN = "routes-token"
CASES = 400
OPS = ("join", "push", "pull", "query", "heartbeat", "leave", "status", "stop")
WRONG = [None, True, -1, 0, 2**64 - 1, -(2**63), 1.5, float("nan"), "", "x" * 200,
         b"\xff\x00", [], [0], {}, {"k": [1, {"n": None}]}, msgpack.ExtType(7, b"e")]
"""Values of the wrong type (or range) for some field, every one msgpack can carry."""
HOSTILE_BYTES: list[bytes] = [
    b"", b"\x00", b"\x00\x00\x00", PREFIX.pack(0xFFFFFFFF) + b"\x80",  # a 4 GiB header
    PREFIX.pack(5) + b"\xdd\xff\xff\xff\xff",  # an array declaring 2**32 items
    PREFIX.pack(5) + b"\xdf\xff\xff\xff\xff",  # a map declaring 2**32 pairs
    PREFIX.pack(5) + b"\xdb\xff\xff\xff\xff",  # a str declaring 4 GiB
    PREFIX.pack(4001) + b"\x91" * 4000 + b"\xc0",  # nested 4000 deep
    PREFIX.pack(3) + b"\x81\x01\x02",  # an int key
    PREFIX.pack(1) + b"\xc1",  # a byte msgpack never uses
]


def raw_frame(packed: bytes, tensor: torch.Tensor | None = None) -> bytes:
    body = b"" if tensor is None else b"".join(bytes(p) for p in tensor_chunks(tensor))
    return PREFIX.pack(len(packed)) + packed + body


def duplicate_keys(header: dict[str, Any], key: str, value: Any) -> bytes:
    """`header` packed with `key` given twice, the second time as `value`."""
    pairs = [*header.items(), (key, value)]
    out = bytearray(b"\xde" + struct.pack(">H", len(pairs)))
    for k, v in pairs:
        out += msgpack.packb(k) + msgpack.packb(v, use_bin_type=True)
    return bytes(out)


class Fuzzer:
    """Makes one hostile request at a time from a seeded generator, for a run whose two
    workers hold `sessions` (rank -> secret)."""

    def __init__(self, rng: random.Random, numel: int, sessions: dict[int, str],
                 ops: tuple[str, ...] = OPS) -> None:
        self.rng = rng
        self.ops = ops
        self.numel = numel
        self.sessions = sessions
        self.seq = 0

    def header(self, op: str, worker: int) -> dict[str, Any]:
        """A well-formed header of `op` from `worker`, which the mutations spoil."""
        self.seq += 1
        base = {"run_id": RUN, "worker": worker, "session": self.sessions.get(worker, "")}
        extra: dict[str, dict[str, Any]] = {
            "push": {"seq": self.seq, "base_version": 0, "kind": "gradient", "steps": 1,
                     "samples": 1, "meta": {}},
            "pull": {"base_version": 0}, "query": {"seq": self.seq, "meta": {}}}
        return {**base, **extra.get(op, {})}

    def vector(self) -> torch.Tensor:
        """A push's vector, always poisoned or malformed, so no push is accepted."""
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            vector = torch.full((self.numel,), 0.25)
            vector[rng.randrange(self.numel)] = rng.choice([float("nan"), float("inf")])
            return vector
        if kind == 1:
            return torch.zeros(self.numel + rng.choice([-1, 1, 1000]))
        if kind == 2:
            return torch.zeros(self.numel, dtype=torch.float64)
        return torch.zeros(rng.randrange(0, 5), dtype=torch.uint8)

    def body(self, op: str) -> bytes:
        rng = self.rng
        if rng.random() < 0.15:
            return rng.choice(HOSTILE_BYTES)
        header = self.header(op, rng.choice([0, 0, 1, 7]))
        if op == "push" and rng.random() < 0.2:  # another rank's secret
            header["session"] = self.sessions.get(1 - header["worker"], "x")
        vector = self.vector() if op in ("push", "query") else None
        if vector is not None:
            dtype = {torch.float32: "float32", torch.uint8: "uint8"}.get(vector.dtype, "f64")
            header["tensor"] = {"dtype": dtype, "shape": [vector.numel()]}
        mutation = rng.randrange(5)
        field = rng.choice([*header, "tensor", "codec", "then_pull", "stats", "away"])
        value = rng.choice(WRONG)
        if mutation == 0:
            header[field] = value
        elif mutation == 1:
            header.pop(field, None)
        elif mutation == 2:
            packed = duplicate_keys(header, field, value)
            return raw_frame(packed, vector)
        data = raw_frame(msgpack.packb(header, use_bin_type=True), vector)
        if mutation == 3:  # cut anywhere, or followed by junk
            return data[: rng.randrange(len(data))] + rng.randbytes(rng.choice([0, 0, 9]))
        return data

    def request(self) -> tuple[str, str, bytes, dict[str, str]]:
        """(method, path, body, headers) of one hostile request."""
        rng = self.rng
        op = rng.choice([*self.ops, *self.ops, "nope", "push/1", "stream", "", "..%2f"])
        path = rng.choice([f"/v1/{op}"] * 8 + [f"/v2/{op}", "/", "/v1"])
        token = rng.choice([TOKEN] + [worker_token(TOKEN)] * 6 + ["wrong", None])
        if op == "stop" and token == TOKEN:
            token = worker_token(TOKEN)  # the run token may stop the run: that is no attack
        headers = {"Content-Type": rng.choice([CONTENT_TYPE] * 9 + ["text/plain", ""])}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        method = rng.choice(["POST"] * 18 + ["GET", "PUT"])
        return method, path, self.body(op), headers


async def fuzz(server: ParameterServer, client: aiohttp.ClientSession, fuzzer: Fuzzer,
               cases: int) -> Counter[int]:
    """Send `cases` requests; returns how many got each status."""
    store = server.core.store
    statuses: Counter[int] = Counter()
    for case in range(cases):
        method, path, data, headers = fuzzer.request()
        before, version = store.w.clone(), store.version
        async with client.request(method, server.url + path, data=data,
                                  headers=headers) as resp:
            text = (await resp.read()).decode("utf-8", "replace")
            status = resp.status
        statuses[status] += 1
        what = f"case {case}: {method} {path} {data[:60]!r} -> {status} {text[:200]!r}"
        assert status < 500, what
        assert status in (200, 101) or (text.strip() and "\n" not in text.strip()), what
        assert store.version == version, what
        assert torch.equal(store.w.view(torch.int32), before.view(torch.int32)), what
    return statuses


class Stream:
    """A raw stream connection (`asyncsync.transport.frame_stream`), reopened whenever the
    server closed it after a refusal."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write((f"POST {STREAM_PATH} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                      f"Upgrade: tcp\r\nAuthorization: Bearer {worker_token(TOKEN)}\r\n"
                      "Content-Length: 0\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return reader, writer

    async def send(self, op: str, body: bytes) -> tuple[int, bytes]:
        """One frame of `op` (whose body may lie about nothing: its length is its own);
        the reply's status and body."""
        if self.conn is None:
            self.conn = await self.open()
        reader, writer = self.conn
        name = op.encode()
        writer.write(REQUEST.pack(len(name), len(body)) + name + body)
        status, size = REPLY.unpack(await reader.readexactly(REPLY.size))
        reply = await reader.readexactly(size)
        if status != 200:  # the server may close the stream after a refusal
            writer.close()
            self.conn = None
        return status, reply


async def fuzz_stream(server: ParameterServer, fuzzer: Fuzzer, cases: int) -> Counter[int]:
    """`fuzz` over the stream channel: the same bodies, framed."""
    store = server.core.store
    statuses: Counter[int] = Counter()
    stream = Stream(server.port)
    for case in range(cases):
        _, path, data, _ = fuzzer.request()
        op = path.rsplit("/", 1)[-1] or "x"
        before, version = store.w.clone(), store.version
        status, reply = await stream.send(op, data)
        statuses[status] += 1
        what = f"stream case {case}: {op} {data[:60]!r} -> {status} {reply[:200]!r}"
        assert status < 500, what
        assert status == 200 or (reply.strip() and b"\n" not in reply.strip()), what
        assert store.version == version, what
        assert torch.equal(store.w.view(torch.int32), before.view(torch.int32)), what
    if stream.conn is not None:
        stream.conn[1].close()
    return statuses


def session_of(reply: bytes) -> str:
    (size,) = PREFIX.unpack(reply[: PREFIX.size])
    return str(decode_header(reply[PREFIX.size : PREFIX.size + size])["meta"]["session"])


async def test_hostile_requests_to_every_route_never_get_a_5xx_nor_change_the_model() -> None:
    rng = random.Random(20261127)
    auth = {"Content-Type": CONTENT_TYPE, "Authorization": f"Bearer {worker_token(TOKEN)}"}
    async with ParameterServer(tiny_model(), "asp", 2, ServerSettings(run_id=RUN),
                               token=TOKEN) as server, aiohttp.ClientSession() as client:
        sessions: dict[int, str] = {}
        numel = server.core.store.numel
        # before the start: nobody joined (a join would wait at the start barrier)
        before_start = tuple(op for op in OPS if op != "join")
        seen = await fuzz(server, client, Fuzzer(rng, numel, sessions, before_start),
                          CASES // 3)
        assert not server.core.run.started

        async def join(rank: int) -> None:
            async with client.post(f"{server.url}/v1/join", headers=auth, data=raw_frame(
                    msgpack.packb({"run_id": RUN, "worker": rank}))) as joined:
                assert joined.status == 200, await joined.text()
                sessions[rank] = session_of(await joined.read())

        await asyncio.gather(join(0), join(1))  # in the run: each rank holds its secret
        seen += await fuzz(server, client, Fuzzer(rng, numel, sessions), CASES)
        streamed = await fuzz_stream(server, Fuzzer(rng, numel, sessions), CASES // 2)
        assert {400, 403, 404, 422} <= set(streamed), streamed
        seen += streamed
        await server.stop()
        seen += await fuzz(server, client, Fuzzer(rng, numel, sessions), CASES // 3)
    assert {400, 401, 403, 404, 410, 413, 415, 422} <= set(seen), seen
