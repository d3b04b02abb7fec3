"""A protocol whose reply meta the wire cannot carry (a protocol author's bug): the
worker gets a clear error naming the protocol, the hook's key and that its request was
carried out, never a bare 500 or a broken connection; the server keeps serving."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest
import torch

from asyncsync.engine.channel import RequestRejected
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.asp import ASP, AspServer
from asyncsync.protocols.base import Pull, Push, Reply
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "meta"


class SetReplyServer(AspServer):
    """ASP whose push reply carries a set (msgpack has no set)."""

    async def on_push(self, push: Push) -> dict[str, Any]:
        meta = await super().on_push(push)
        return {**meta, "seen": {"ranks": {push.worker}}}


SET_REPLY = dataclasses.replace(ASP, name="asp-set-reply", server=SetReplyServer)


def frame(header: dict[str, Any], tensor: torch.Tensor | None = None) -> bytes:
    data = encode_header(header, tensor)
    return data + (b"" if tensor is None else b"".join(bytes(p) for p in tensor_chunks(tensor)))


def push(session: str) -> dict[str, Any]:
    return {"worker": 0, "run_id": RUN, "session": session, "seq": 1, "base_version": 0,
            "kind": "gradient", "steps": 1, "samples": 1}


async def test_an_unsendable_push_reply_is_a_clear_error_over_http() -> None:
    async with ParameterServer(tiny_model(), SET_REPLY, 1,
                               ServerSettings(run_id=RUN, lr=1.0)) as server:
        store = server.core.store
        before = store.w.clone()
        headers = {"Content-Type": CONTENT_TYPE}
        async with aiohttp.ClientSession() as client:
            joined = await client.post(f"{server.url}/v1/join", headers=headers,
                                       data=frame({"worker": 0, "run_id": RUN}))
            raw = await joined.read()
            (size,) = PREFIX.unpack(raw[:PREFIX.size])
            session = decode_header(raw[PREFIX.size:PREFIX.size + size])["meta"]["session"]
            gradient = torch.full((store.numel,), 0.5)
            resp = await client.post(f"{server.url}/v1/push", headers=headers,
                                     data=frame(push(session), gradient))
            text = await resp.text()
            assert resp.status == 500, text
            for part in ("asp-set-reply", "'seen.ranks'", "set", "was carried out"):
                assert part in text, (part, text)
            assert "\n" not in text.strip()
            # the rule did apply it (lr 1, plain SGD: w - 0.5), and says so above
            assert store.version == 1
            assert torch.equal(store.w, before - 0.5)
            # the server still serves: a pull of the same session is answered
            pulled = await client.post(f"{server.url}/v1/pull", headers=headers, data=frame(
                {"worker": 0, "run_id": RUN, "session": session, "base_version": 1}))
            assert pulled.status == 200, await pulled.text()


async def test_an_unsendable_push_reply_is_a_clear_error_in_process() -> None:
    server = ParameterServer(tiny_model(), SET_REPLY, 1, ServerSettings(run_id=RUN))
    transport = LocalTransport(server.core)
    reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN}, None)
    with pytest.raises(RequestRejected, match=r"'seen\.ranks' is a set") as refused:
        await transport.request("push", push(reply["meta"]["session"]),
                                torch.zeros(server.core.store.numel))
    assert refused.value.status == 500
    assert server.core.store.version == 1
    await server.core.stop()
    await server.core.close()


class NoMetaServer(AspServer):
    """ASP whose query answers None instead of a dict of meta."""

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        return None  # type: ignore[return-value]


async def test_a_reply_meta_that_is_not_a_map_is_a_clear_error() -> None:
    server = ParameterServer(tiny_model(), dataclasses.replace(
        ASP, name="asp-no-meta", server=NoMetaServer), 1, ServerSettings(run_id=RUN))
    transport = LocalTransport(server.core)
    reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN}, None)
    with pytest.raises(RequestRejected, match=r"asp-no-meta.* NoneType, not a map") as refused:
        await transport.request("query", {"worker": 0, "run_id": RUN,
                                          "session": reply["meta"]["session"], "meta": {}})
    assert refused.value.status == 500
    await server.core.stop()
    await server.core.close()


class NoPullMetaServer(AspServer):
    """ASP whose pull answers None for its meta."""

    async def on_pull(self, pull: Pull) -> Reply:
        return dataclasses.replace(await super().on_pull(pull), meta=None)  # type: ignore[arg-type]


async def test_a_pull_after_a_push_whose_meta_is_not_a_map_is_a_clear_error() -> None:
    """``then_pull``: the push's meta is put into the pull's, which must be a map too."""
    server = ParameterServer(tiny_model(), dataclasses.replace(
        ASP, name="asp-no-pull-meta", server=NoPullMetaServer), 1, ServerSettings(run_id=RUN))
    transport = LocalTransport(server.core)
    reply, _ = await transport.request("join", {"worker": 0, "run_id": RUN}, None)
    with pytest.raises(RequestRejected, match=r"asp-no-pull-meta.* pull .*NoneType, not a map"
                       ) as refused:
        await transport.request("push", {**push(reply["meta"]["session"]), "then_pull": True},
                                torch.zeros(server.core.store.numel))
    assert refused.value.status == 500
    assert server.core.store.version == 1  # the push was carried out, as the error says
    await server.core.stop()
    await server.core.close()
