"""Fuzzing a live server: thousands of malformed, truncated, oversized and random
requests. Each gets a 4xx, the server keeps serving, and the model never changes."""

from __future__ import annotations

import random
import time

import aiohttp
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUESTS = 3000
TIME_LIMIT_S = 40.0


def frame(header: dict[str, object], vector: torch.Tensor) -> bytes:
    return encode_header(header, vector) + b"".join(bytes(p) for p in tensor_chunks(vector))


def mutants(numel: int, rng: random.Random, session: str) -> tuple[str, bytes, dict[str, str]]:
    """One hostile request: (operation, body, headers), from the holder of worker 0's
    session secret (so the mutations reach past the session check)."""
    poisoned = torch.full((numel,), 0.01)
    poisoned[rng.randrange(numel)] = float("nan")  # whatever else passes, this cannot
    header = {"worker": 0, "run_id": "fuzz", "base_version": 0, "kind": "gradient",
              "steps": 1, "samples": 4, "session": session}
    body = frame(header, poisoned)
    head_len = PREFIX.size + PREFIX.unpack(body[:PREFIX.size])[0]
    # every operation but "stop", which a caller holding the token may legitimately send
    op = rng.choice(["push", "push", "push", "pull", "join", "query", "heartbeat", "leave",
                     "status", "nope", "push/x", ""])
    headers = {"Content-Type": CONTENT_TYPE, **AUTH}
    kind = rng.randrange(8)
    if kind == 0:  # random bytes
        body = rng.randbytes(rng.randrange(0, 4096))
    elif kind == 1:  # truncated anywhere
        body = body[: rng.randrange(len(body))]
    elif kind == 2:  # flipped bytes in the prefix or header
        raw = bytearray(body)
        for _ in range(rng.randrange(1, 6)):
            raw[rng.randrange(head_len)] = rng.randrange(256)
        body = bytes(raw)
    elif kind == 3:  # oversized: trailing garbage
        body += rng.randbytes(rng.randrange(1, 200_000))
    elif kind == 4:  # a header of random msgpack-ish values
        junk = {rng.choice(["worker", "run_id", "tensor", "meta", "kind", "base_version"]):
                rng.choice([None, -1, 2**70, "x" * 300, [1, 2], {"a": 1}, True, 1.5, b"\x00"])
                for _ in range(4)}
        try:
            body = encode_header({**header, **junk}, None) + rng.randbytes(64)
        except (ValueError, TypeError, OverflowError):
            body = rng.randbytes(64)
    elif kind == 5:  # wrong or missing token
        headers = {"Content-Type": CONTENT_TYPE,
                   **rng.choice([{}, {"Authorization": "Bearer nope"},
                                 {"Authorization": rng.randbytes(8).hex()}])}
    elif kind == 6:  # wrong content type
        headers = {"Content-Type": rng.choice(["text/plain", "application/json", ""]), **AUTH}
    # kind 7: the poisoned but otherwise well-formed push
    return op, body, headers


def session_of(reply: bytes) -> str:
    """The session secret in a join's reply frame."""
    (size,) = PREFIX.unpack(reply[: PREFIX.size])
    return str(decode_header(reply[PREFIX.size : PREFIX.size + size])["meta"]["session"])


async def test_fuzzed_requests_are_all_refused_and_change_nothing() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id="fuzz"),
                               token=TOKEN) as server:
        numel = server.core.store.numel
        before = server.core.store.w.clone()
        rng = random.Random(1234)
        statuses: dict[int, int] = {}
        began = time.monotonic()
        async with aiohttp.ClientSession() as session:
            join = await session.post(f"{server.url}/v1/join", headers={
                "Content-Type": CONTENT_TYPE, **AUTH},
                data=encode_header({"worker": 0, "run_id": "fuzz"}, None))
            assert join.status == 200
            secret = session_of(await join.read())
            sent = 0
            while sent < REQUESTS and time.monotonic() - began < TIME_LIMIT_S:
                op, body, headers = mutants(numel, rng, secret)
                async with session.post(f"{server.url}/v1/{op}", data=body,
                                        headers=headers) as resp:
                    reply = await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    if op == "join" and resp.status == 200:
                        secret = session_of(reply)  # a join re-synced and renewed it
                    if resp.status < 400:
                        assert op in ("join", "leave", "status", "heartbeat", "pull"), (op,
                                                                                      body[:80])
                sent += 1
        assert sent >= 1000, f"only {sent} requests in {TIME_LIMIT_S} s"
        assert not any(status >= 500 for status in statuses), statuses
        assert sum(n for status, n in statuses.items() if 400 <= status < 500) > 0.8 * sent
        assert server.core.store.version == 0
        assert torch.equal(server.core.store.w, before)
        # still serving: a well-formed request from a (re)joined worker is applied
        async with aiohttp.ClientSession(headers={"Content-Type": CONTENT_TYPE, **AUTH}) as s:
            joined = await s.post(f"{server.url}/v1/join", data=encode_header(
                {"worker": 0, "run_id": "fuzz", "session": secret}, None))
            good = frame({"worker": 0, "run_id": "fuzz", "base_version": 0, "kind": "gradient",
                          "steps": 1, "samples": 4, "session": session_of(await joined.read())},
                         torch.full((numel,), 0.01))
            resp = await s.post(f"{server.url}/v1/push", data=good)
            await resp.read()
            assert resp.status == 200, await resp.text()
        assert server.core.store.version == 1
