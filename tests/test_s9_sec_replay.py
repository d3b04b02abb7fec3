"""Replayed pushes: a push frame sent again is refused (409, a reason, the model untouched)
on every protocol, round-based or not, because each push of a session carries a number
(``seq``) that the server core accepts once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import torch

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.membership import SEQ_WINDOW
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import BadRequest, OutOfStep, get_protocol
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.frames import CONTENT_TYPE, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "replay"
APPLY_EACH_PUSH = [("asp", {}, "gradient"), ("ssp", {}, "gradient"),
                   ("fedbuff", {"buffer_size": 1}, "delta"), ("fedasync", {}, "delta")]
"""Protocols that apply every push as it comes (no round to refuse a duplicate)."""


def frame(header: dict[str, Any], tensor: torch.Tensor) -> bytes:
    return encode_header(header, tensor) + b"".join(bytes(p) for p in tensor_chunks(tensor))


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[ParameterServer]:
    name, params, _ = request.param
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), name, 1, settings,
                               protocol_params=get_protocol(name).params(**params)) as server:
        yield server


def record_headers(core: ServerCore) -> list[dict[str, Any]]:
    """The decoded headers of the requests `core` handles from now on."""
    seen: list[dict[str, Any]] = []
    handle = core.handle

    async def recording(op: str, header: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        seen.append({"op": op, **header})
        return await handle(op, header, *args, **kwargs)

    core.handle = recording  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("server", APPLY_EACH_PUSH, indirect=True,
                         ids=[p[0] for p in APPLY_EACH_PUSH])
@pytest.mark.parametrize("channel", ["stream", "http"])
async def test_a_push_frame_sent_again_is_refused_and_changes_nothing(
        server: ParameterServer, channel: str) -> None:
    core = server.core
    kind = next(k for k in core.rule.push_kinds)
    seen = record_headers(core)
    transport = HttpTransport(server.url, core.store.numel, channel=channel)
    try:
        reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN})
        secret = reply["meta"]["session"]
        vector = torch.full((core.store.numel,), 0.01)
        for _ in range(2):
            await transport.request("push", {
                "worker": 0, "run_id": RUN, "session": secret, "kind": kind, "steps": 1,
                "samples": 4, "base_version": core.store.version}, vector)
    finally:
        await transport.close()
    pushes = [h for h in seen if h["op"] == "push"]
    assert [h["seq"] for h in pushes] == [1, 2]  # the transport numbers each push
    version, model = core.store.version, core.store.w.clone()
    replayed = {k: v for k, v in pushes[-1].items() if k not in ("op", "tensor")}
    async with aiohttp.ClientSession() as session:
        for header in (replayed, {**replayed, "seq": 1}):  # the last push, and an earlier one
            async with session.post(f"{server.url}/v1/push", data=frame(header, vector),
                                    headers={"Content-Type": CONTENT_TYPE}) as resp:
                assert resp.status == 409, await resp.read()
                assert "already" in await resp.text()
    assert core.store.version == version
    assert torch.equal(core.store.w, model)


async def joined_core(name: str = "asp") -> tuple[ServerCore, str]:
    core = build_core(tiny_model(), name, 1, ServerSettings(run_id=RUN, worker_timeout_s=None))
    reply, _ = await core.handle("join", {"worker": 0, "run_id": RUN}, None)
    return core, str(reply["meta"]["session"])


def push(core: ServerCore, secret: str, **fields: Any) -> dict[str, Any]:
    return {"worker": 0, "run_id": RUN, "session": secret, "kind": "gradient", "steps": 1,
            "samples": 4, "base_version": core.store.version, **fields}


async def test_pushes_sent_concurrently_may_arrive_out_of_order_but_each_counts_once(
        ) -> None:
    core, secret = await joined_core()
    vector = torch.full((core.store.numel,), 0.01)
    try:
        for seq in (2, 1, 5, 3):  # 4 is still to come: not a replay
            await core.handle("push", push(core, secret, seq=seq), vector)
        assert core.store.version == 4
        for seq in (1, 2, 3, 5):
            with pytest.raises(OutOfStep, match=f"push {seq} .*already"):
                await core.handle("push", push(core, secret, seq=seq), vector)
        await core.handle("push", push(core, secret, seq=5 + SEQ_WINDOW), vector)
        with pytest.raises(OutOfStep, match="already"):  # now out of the window: refused
            await core.handle("push", push(core, secret, seq=4), vector)
        assert core.store.version == 5
    finally:
        await core.close()


@pytest.mark.parametrize("seq", [0, -1, True, "1", 1.0, 2**64, None])
async def test_a_malformed_push_number_is_a_400(seq: object) -> None:
    core, secret = await joined_core()
    vector = torch.full((core.store.numel,), 0.01)
    try:
        await core.handle("push", push(core, secret, seq=1), vector)
        with pytest.raises(BadRequest, match="seq"):  # None: unnumbered once numbered
            await core.handle("push", push(core, secret, seq=seq), vector)
        assert core.store.version == 1
    finally:
        await core.close()


async def test_a_new_session_numbers_its_pushes_afresh() -> None:
    """A restarted worker (a new session of its rank) starts again from push 1."""
    core, secret = await joined_core()
    vector = torch.full((core.store.numel,), 0.01)
    try:
        await core.handle("push", push(core, secret, seq=1), vector)
        await core.handle("leave", {"worker": 0, "run_id": RUN, "session": secret}, None)
        reply, _ = await core.handle("join", {"worker": 0, "run_id": RUN}, None)
        fresh = str(reply["meta"]["session"])
        await core.handle("push", push(core, fresh, seq=1), vector)
        assert core.store.version == 2
    finally:
        await core.close()


async def test_the_in_process_transport_numbers_pushes_too() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(run_id=RUN,
                                                             worker_timeout_s=None))
    seen = record_headers(core)
    transport = LocalTransport(core)
    try:
        reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN})
        vector = torch.full((core.store.numel,), 0.01)
        header = push(core, reply["meta"]["session"])
        for _ in range(3):
            await transport.request("push", dict(header), vector)
        assert [h.get("seq") for h in seen if h["op"] == "push"] == [1, 2, 3]
    finally:
        await core.close()
