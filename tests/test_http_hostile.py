"""Malformed and hostile requests against a live server: each gets a 4xx with a one-line
reason, and the global model and version stay exactly as they were."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import torch

import asyncsync.engine.core as core_module
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import BadRequest, OutOfStep, Push
from asyncsync.protocols.diloco import DilocoParams, DilocoServer
from asyncsync.protocols.dssync import DsSyncParams, DsSyncServer
from asyncsync.training.optim import FlatSGD
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.tokens import worker_token
from asyncsync.wire.codecs import INT8_CHUNK
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "hostile"
SESSION = {"secret": ""}
"""The session secret of the fixture's worker 0 (its join reply gives it)."""


@pytest.fixture
async def live() -> AsyncIterator[tuple[ParameterServer, aiohttp.ClientSession, int]]:
    server = ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN))
    await server.start()
    numel = server.core.store.numel
    async with aiohttp.ClientSession() as session:
        ok = await post(session, server.url, "join", body({"worker": 0, "run_id": RUN}))
        assert ok.status == 200
        reply = await ok.read()
        (size,) = PREFIX.unpack(reply[: PREFIX.size])
        SESSION["secret"] = decode_header(reply[PREFIX.size : PREFIX.size + size])["meta"][
            "session"]
        yield server, session, numel
    await server.close()


def body(header: dict[str, Any], tensor: torch.Tensor | None = None) -> bytes:
    data = encode_header(header, tensor)
    if tensor is not None:
        data += b"".join(bytes(p) for p in tensor_chunks(tensor))
    return data


def push_header(**overrides: Any) -> dict[str, Any]:
    header = {"worker": 0, "run_id": RUN, "base_version": 0, "kind": "gradient",
              "steps": 1, "samples": 8, "session": SESSION["secret"]}
    header.update(overrides)
    return {k: v for k, v in header.items() if v is not None}


async def post(session: aiohttp.ClientSession, url: str, op: str, data: bytes,
               content_type: str = CONTENT_TYPE) -> aiohttp.ClientResponse:
    resp = await session.post(f"{url}/v1/{op}", data=data,
                              headers={"Content-Type": content_type})
    await resp.read()
    return resp


def raw_header(blob: bytes) -> bytes:
    return PREFIX.pack(len(blob)) + blob


def cases(numel: int) -> list[tuple[str, str, bytes, str, int, str]]:
    good = torch.full((numel,), 0.01)
    nan = good.clone()
    nan[3] = math.nan
    inf = good.clone()
    inf[0] = math.inf
    ok_head = encode_header(push_header(), good)
    return [
        ("malformed msgpack", "push", raw_header(b"\xc1\xc1\xc1"), CONTENT_TYPE, 400,
         "malformed"),
        ("header not a map", "push", raw_header(msgpack.packb([1, 2])), CONTENT_TYPE, 400,
         "map"),
        ("empty body", "push", b"", CONTENT_TYPE, 400, "truncated"),
        ("oversized body", "push", body(push_header(), good) + bytes(70_000), CONTENT_TYPE,
         413, "exceeds"),
        ("oversized header", "push", PREFIX.pack(1 << 20) + b"\x80", CONTENT_TYPE, 413,
         "exceeds"),
        ("truncated tensor", "push", body(push_header(), good)[:-9], CONTENT_TYPE, 400,
         "truncated"),
        ("trailing bytes", "push", body(push_header(), good) + b"x", CONTENT_TYPE, 400,
         "trailing"),
        ("wrong shape", "push", body(push_header(), torch.zeros(numel + 1)), CONTENT_TYPE,
         422, "shape"),
        ("wrong dtype", "push", ok_head.replace(b"float32", b"float64") + bytes(8 * numel),
         CONTENT_TYPE, 422, "dtype"),
        ("NaN", "push", body(push_header(), nan), CONTENT_TYPE, 422, "non-finite"),
        ("Inf", "push", body(push_header(), inf), CONTENT_TYPE, 422, "non-finite"),
        ("unknown worker", "push", body(push_header(worker=7), good), CONTENT_TYPE, 403,
         "unknown worker"),
        ("negative worker", "push", body(push_header(worker=-1), good), CONTENT_TYPE, 403,
         "unknown worker"),
        ("bool worker", "push", body(push_header(worker=True), good), CONTENT_TYPE, 400,
         "worker"),
        ("wrong run", "push", body(push_header(run_id="other"), good), CONTENT_TYPE, 403,
         "wrong run"),
        ("missing run", "push", body(push_header(run_id=None), good), CONTENT_TYPE, 400,
         "run_id"),
        ("missing base version", "push", body(push_header(base_version=None), good),
         CONTENT_TYPE, 400, "base_version"),
        ("future base version", "push", body(push_header(base_version=5), good),
         CONTENT_TYPE, 409, "ahead"),
        ("negative steps", "push", body(push_header(steps=-1), good), CONTENT_TYPE, 400,
         "steps"),
        ("unknown kind", "push", body(push_header(kind="model"), good), CONTENT_TYPE, 400,
         "kind"),
        ("no tensor", "push", body(push_header()), CONTENT_TYPE, 400, "no tensor"),
        ("meta not a map", "push", body(push_header(meta=[1]), good), CONTENT_TYPE, 400,
         "meta"),
        ("tensor on a pull", "pull", body({"worker": 0, "run_id": RUN, "base_version": 0,
                                             "session": SESSION["secret"]},
                                          good), CONTENT_TYPE, 400, "no tensor"),
        ("wrong content type", "push", body(push_header(), good), "application/json", 415,
         "content type"),
        ("unknown operation", "explode", body({"run_id": RUN}), CONTENT_TYPE, 404,
         "unknown operation"),
        ("dtype a list", "push", spec_body(numel, dtype=[1, 2]), CONTENT_TYPE, 422, "dtype"),
        ("dtype a map", "push", spec_body(numel, dtype={"a": 1}), CONTENT_TYPE, 422, "dtype"),
        ("shape nested 1000 deep", "push", spec_body(numel, shape=nested(1000)), CONTENT_TYPE,
         422, "shape"),
        ("kind nested 1000 deep", "push", body(push_header(kind=nested(1000)), good),
         CONTENT_TYPE, 400, "kind"),
        *compressed_cases(numel),
    ]


def compressed(codec: object, payload: torch.Tensor) -> bytes:
    """A gradient push whose tensor is the compressed `payload` described by `codec`."""
    return body({**push_header(), "codec": codec}, payload)


def topk_payload(indices: list[int], values: list[float]) -> torch.Tensor:
    return torch.cat([torch.tensor(indices, dtype=torch.int32).view(torch.uint8),
                      torch.tensor(values).view(torch.uint8)])


def compressed_cases(numel: int) -> list[tuple[str, str, bytes, str, int, str]]:
    """Malformed compressed pushes (see asyncsync.wire.codecs)."""
    good_topk = {"name": "topk", "numel": numel, "k": 2}
    chunks = -(-numel // INT8_CHUNK)
    nan_scales = torch.cat([torch.full((chunks,), math.nan).view(torch.uint8),
                            torch.ones(numel, dtype=torch.int8).view(torch.uint8)])
    huge_half = torch.full((numel,), math.inf, dtype=torch.float16).view(torch.uint8)
    return [
        ("unknown codec", "push", compressed({"name": "zip", "numel": numel},
                                             torch.zeros(8, dtype=torch.uint8)),
         CONTENT_TYPE, 400, "unknown codec"),
        ("codec not a map", "push", compressed([1], torch.zeros(8, dtype=torch.uint8)),
         CONTENT_TYPE, 400, "codec"),
        ("codec numel wrong", "push", compressed({"name": "float16", "numel": numel + 1},
                                                 torch.zeros(2 * numel, dtype=torch.uint8)),
         CONTENT_TYPE, 400, "numel"),
        ("topk k out of range", "push", compressed({**good_topk, "k": numel + 1},
                                                   torch.zeros(8, dtype=torch.uint8)),
         CONTENT_TYPE, 400, "k must be"),
        ("compressed payload too short", "push",
         compressed(good_topk, topk_payload([0, 1], [0.1, 0.2])[:-4]), CONTENT_TYPE, 422,
         "shape"),
        ("compressed payload not uint8", "push",
         compressed({"name": "float16", "numel": numel}, torch.zeros(numel // 2)),
         CONTENT_TYPE, 422, "dtype"),
        ("topk index out of range", "push",
         compressed(good_topk, topk_payload([0, numel], [0.1, 0.2])), CONTENT_TYPE, 422,
         "indices"),
        ("topk negative index", "push",
         compressed(good_topk, topk_payload([-1, 3], [0.1, 0.2])), CONTENT_TYPE, 422,
         "indices"),
        ("topk repeated index", "push",
         compressed(good_topk, topk_payload([3, 3], [0.1, 0.2])), CONTENT_TYPE, 422,
         "indices"),
        ("int8 NaN scale", "push", compressed({"name": "int8", "numel": numel}, nan_scales),
         CONTENT_TYPE, 422, "non-finite"),
        ("float16 Inf", "push", compressed({"name": "float16", "numel": numel}, huge_half),
         CONTENT_TYPE, 422, "non-finite"),
    ]


def nested(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth):
        value = [value]
    return value


def spec_body(numel: int, **spec: Any) -> bytes:
    """A push whose tensor descriptor says `spec` (dtype, shape) over float32 bytes."""
    tensor = {"dtype": "float32", "shape": [numel], **spec}
    return raw_header(msgpack.packb({**push_header(), "tensor": tensor})) + bytes(4 * numel)


async def test_every_bad_request_is_refused_and_changes_nothing(
    live: tuple[ParameterServer, aiohttp.ClientSession, int],
) -> None:
    server, session, numel = live
    before = server.core.store.w.clone()
    for name, op, data, content_type, status, reason in cases(numel):
        resp = await post(session, server.url, op, data, content_type)
        text = await resp.text()
        assert resp.status == status, f"{name}: got {resp.status} {text!r}"
        assert reason in text, f"{name}: reason {text!r} lacks {reason!r}"
        assert "\n" not in text.strip(), f"{name}: reason is not one line"
        assert server.core.store.version == 0, name
        assert torch.equal(server.core.store.w, before), name
    assert server.core.workers[0].nonfinite == 4  # the NaN, NaN-scale and two Inf pushes
    # The same server accepts a well-formed push, so the checks above could have failed.
    resp = await post(session, server.url, "push",
                      body(push_header(), torch.full((numel,), 0.01)))
    assert resp.status == 200
    assert server.core.store.version == 1
    assert not torch.equal(server.core.store.w, before)


async def test_a_push_is_checked_for_nan_once_while_it_arrives(
    live: tuple[ParameterServer, aiohttp.ClientSession, int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The core makes no second pass over a float32 push received over HTTP: with its own
    check made to pass everything, a NaN in the last element is still refused."""
    server, session, numel = live
    second_passes: list[torch.Tensor] = []

    def core_check(vector: torch.Tensor) -> bool:
        second_passes.append(vector)
        return True

    monkeypatch.setattr(core_module, "all_finite", core_check)
    bad = torch.full((numel,), 0.01)
    bad[-1] = math.nan
    resp = await post(session, server.url, "push", body(push_header(), bad))
    assert resp.status == 422
    assert "non-finite" in await resp.text()
    assert not second_passes
    assert server.core.store.version == 0


async def test_push_before_join_is_refused() -> None:
    async with ParameterServer(tiny_model(), "asp", 2, ServerSettings(run_id=RUN)) as server:
        numel = server.core.store.numel
        async with aiohttp.ClientSession() as session:
            resp = await post(session, server.url, "push",
                              body(push_header(), torch.zeros(numel)))
            assert resp.status == 410
            assert "not in the run" in await resp.text()
        assert server.core.store.version == 0


async def test_server_listens_on_loopback_by_default() -> None:
    async with ParameterServer(tiny_model(), "asp", workers=1) as server:
        assert server.url.startswith("http://127.0.0.1:")


async def test_a_worker_that_keeps_sending_nan_is_reported(
    live: tuple[ParameterServer, aiohttp.ClientSession, int], caplog: pytest.LogCaptureFixture,
) -> None:
    server, session, numel = live
    nan = torch.full((numel,), math.nan)
    with caplog.at_level(logging.WARNING, logger="asyncsync.server"):
        for _ in range(3):
            resp = await post(session, server.url, "push", body(push_header(), nan))
            assert resp.status == 422
    assert "worker 0 has sent 3 non-finite updates" in caplog.text
    assert server.core.status()["workers"][0]["nonfinite"] == 3
    assert server.core.store.version == 0


async def test_infinite_stats_in_a_heartbeat_do_not_break_the_status(
    live: tuple[ParameterServer, aiohttp.ClientSession, int],
) -> None:
    server, session, _ = live
    beat = {"worker": 0, "run_id": RUN, "session": SESSION["secret"],
            "stats": {"steps": math.inf, "wall_s": math.nan, "samples": 5}}
    assert (await post(session, server.url, "heartbeat", body(beat))).status == 200
    resp = await post(session, server.url, "status", body({}))
    assert resp.status == 200
    assert server.core.status()["workers"][0]["steps"] == 0  # the infinite count was dropped


async def test_huge_finite_stats_in_a_heartbeat_do_not_break_the_status(
    live: tuple[ParameterServer, aiohttp.ClientSession, int],
) -> None:
    server, session, _ = live
    beat = {"worker": 0, "run_id": RUN, "session": SESSION["secret"],
            "stats": {"steps": 1e300, "bytes_up": 1e30, "overruns": 2.0**64, "samples": 5}}
    assert (await post(session, server.url, "heartbeat", body(beat))).status == 200
    resp = await post(session, server.url, "status", body({}))
    assert resp.status == 200, await resp.text()
    worker = server.core.status()["workers"][0]
    assert (worker["steps"], worker["bytes_up"], worker["overruns"]) == (0, 0, 0)


async def test_a_non_utf8_authorization_header_gets_401() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, token="s3cret") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        payload = encode_header({"run_id": "run"}, None)
        writer.write(b"POST /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe"
                     b"\r\nContent-Type: " + CONTENT_TYPE.encode() + b"\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        assert status_line.split()[1] == b"401", status_line


async def test_protocol_refusals_never_repr_deep_peer_data() -> None:
    deep = nested(5000)
    store = ParameterStore(torch.zeros(8), 2, FlatSGD(0.1))
    with pytest.raises(BadRequest) as fragment:
        DilocoServer(DilocoParams(), store).fragment_of({"fragment": deep})
    rule = DsSyncServer(DsSyncParams(), store)
    with pytest.raises(OutOfStep) as iteration:
        await rule.on_push(Push(0, 0, "model", torch.zeros(8), 1, 1, {"iteration": deep}))
    for refusal in (fragment.value, iteration.value):
        assert len(refusal.reason) < 200 and "..." in refusal.reason


@pytest.mark.parametrize(("authorization", "op", "status"), [
    (b"", "status", b"401"),
    (b"", "push/x", b"401"),  # no such operation: still the token first
    (b"Bearer wrong", "push", b"401"),
    (b"Bearer " + worker_token("s3cret").encode(), "stop", b"403"),
    (b"Bearer s3cret", "status", b"100"),
])
async def test_expect_100_continue_is_authenticated_before_the_body(
    authorization: bytes, op: str, status: bytes,
) -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id=RUN),
                               token="s3cret") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        payload = encode_header({"run_id": RUN}, None)
        writer.write(f"POST /v1/{op} HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
                     f"Content-Length: {len(payload)}\r\nExpect: 100-continue\r\n".encode()
                     + (b"Authorization: " + authorization + b"\r\n" if authorization else b"")
                     + b"\r\n")  # the body follows only a 100 Continue
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        assert status_line.split()[1] == status, status_line
        writer.write(payload)  # (a refused client may send its body all the same)
        if status == b"100":
            await asyncio.wait_for(reader.readline(), 10)  # the blank line after it
            final = await asyncio.wait_for(reader.readline(), 10)
            assert final.split()[1] == b"200", final
        else:  # the refusal closes the connection
            assert b"Connection: close" in await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert not server.core.store.stopping
