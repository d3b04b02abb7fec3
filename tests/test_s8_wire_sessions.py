"""Sessions and the run's end against a live server: stale and forged secrets, ranks out
of range, concurrent joins of one rank, a push sent twice, requests after stop. Each
refusal is a 4xx with its reason and leaves the model and version as they were."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.frame_stream import StreamConnection
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "sessions"


def frame(header: dict[str, Any], tensor: torch.Tensor | None = None) -> bytes:
    data = encode_header(header, tensor)
    if tensor is not None:
        data += b"".join(bytes(piece) for piece in tensor_chunks(tensor))
    return data


def head_of(reply: bytes) -> dict[str, Any]:
    (size,) = PREFIX.unpack(reply[:PREFIX.size])
    return decode_header(reply[PREFIX.size:PREFIX.size + size])


class Client:
    """Raw POSTs to one server."""

    def __init__(self, server: ParameterServer, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session

    async def send(self, op: str, header: dict[str, Any],
                   tensor: torch.Tensor | None = None) -> tuple[int, bytes]:
        async with self.session.post(f"{self.server.url}/v1/{op}", data=frame(header, tensor),
                                     headers={"Content-Type": CONTENT_TYPE}) as resp:
            return resp.status, await resp.read()

    async def join(self, worker: int, secret: str | None = None) -> str:
        return await self.join_with({"worker": worker, "run_id": RUN,
                                     **({"session": secret} if secret else {})})

    async def join_with(self, header: dict[str, Any]) -> str:
        status, reply = await self.send("join", header)
        assert status == 200, reply
        return str(head_of(reply)["meta"]["session"])

    def push(self, worker: int, secret: str, **fields: Any) -> dict[str, Any]:
        return {"worker": worker, "run_id": RUN, "session": secret, "kind": "gradient",
                "base_version": self.server.core.store.version, "steps": 1, "samples": 4,
                **fields}

    def gradient(self) -> torch.Tensor:
        return torch.full((self.server.core.store.numel,), 0.01)


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    protocol, workers = getattr(request, "param", ("asp", 1))
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), protocol, workers, settings) as server, \
            aiohttp.ClientSession() as session:
        yield Client(server, session)


async def refused(client: Client, op: str, header: dict[str, Any], status: int, reason: str,
                  tensor: torch.Tensor | None = None) -> None:
    """`header` is refused with `status` and a reason holding `reason`; nothing changed."""
    store = client.server.core.store
    version, model = store.version, store.w.clone()
    got, text = await client.send(op, header, tensor)
    assert (got, reason in text.decode()) == (status, True), (got, text[:200])
    assert store.version == version and torch.equal(store.w, model)


async def test_a_stale_secret_from_before_a_rejoin_is_refused(client: Client) -> None:
    first = await client.join(0)
    second = await client.join(0, first)  # the same worker re-syncs: a fresh secret
    assert second != first
    await refused(client, "push", client.push(0, first), 403, "session secret",
                  client.gradient())
    await refused(client, "leave", {"worker": 0, "run_id": RUN, "session": first}, 403,
                  "session secret")
    assert 0 in client.server.core.store.live
    status, _ = await client.send("push", client.push(0, second), client.gradient())
    assert status == 200 and client.server.core.store.version == 1


@pytest.mark.parametrize("client", [("bsp", 2)], indirect=True)
async def test_concurrent_joins_of_one_rank_give_it_one_session(client: Client) -> None:
    """Three clients join as rank 0 at once, during the start barrier: one holds the
    rank's session once the run starts (each later one took the earlier over), the others
    are refused with 403, saying so."""
    joins = [asyncio.create_task(client.send("join", {"worker": 0, "run_id": RUN}))
             for _ in range(3)]
    await asyncio.sleep(0.2)
    await client.join(1)
    answers = await asyncio.wait_for(asyncio.gather(*joins), 30)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 403, 403], answers
    assert all(b"taken over" in text for status, text in answers if status == 403)
    (winner,) = [head_of(text)["meta"]["session"] for status, text in answers if status == 200]
    assert client.server.core.workers[0].session == winner


async def test_ranks_out_of_range_and_forged_secrets_are_refused(client: Client) -> None:
    secret = await client.join(0)
    gradient = client.gradient()
    for worker in (1, -1, 2**64 - 1, -2**63):
        await refused(client, "push", client.push(worker, secret), 403, "unknown worker",
                      gradient)
    for forged in ("", "0" * 32, secret.upper(), secret[:-1], secret + "0"):
        await refused(client, "push", client.push(0, forged), 403, "session secret", gradient)
    await refused(client, "push", client.push(0, secret, run_id=RUN + "x"), 403, "wrong run",
                  gradient)


@pytest.mark.parametrize("client", [("bsp", 2)], indirect=True)
async def test_a_push_sent_twice_in_a_round_counts_once(client: Client) -> None:
    secrets = await asyncio.gather(client.join(0), client.join(1))
    push = client.push(0, secrets[0])
    status, _ = await client.send("push", push, client.gradient())
    assert status == 200
    await refused(client, "push", push, 409, "already pushed", client.gradient())
    status, _ = await client.send("push", client.push(1, secrets[1]), client.gradient())
    assert status == 200 and client.server.core.store.version == 1


async def test_after_stop_every_request_is_told_stop_and_changes_nothing(
    client: Client,
) -> None:
    secret = await client.join(0)
    await client.server.stop()
    store = client.server.core.store
    version, model = store.version, store.w.clone()
    await refused(client, "push", client.push(0, "forged"), 403, "session secret",
                  client.gradient())
    me = {"worker": 0, "run_id": RUN, "session": secret}
    for op, header, tensor in [
        ("push", client.push(0, secret), client.gradient()),
        ("pull", {**me, "base_version": 0}, None), ("heartbeat", me, None),
        ("join", me, None), ("query", {**me, "meta": {}}, None), ("leave", me, None),
    ]:
        status, reply = await client.send(op, header, tensor)
        assert status == 200 and head_of(reply)["stop"] is True, (op, reply[:100])
    assert store.version == version and torch.equal(store.w, model)
    assert not store.live and client.server.core.finished.is_set()


async def test_a_join_that_says_it_runs_another_protocol_or_model_is_refused(
    client: Client,
) -> None:
    """(A bsp worker joined an asp server and trained; a worker with a larger model failed
    with a tensor size error. A worker may say what it runs: the join is refused first.)"""
    numel = client.server.core.store.numel
    me = {"worker": 0, "run_id": RUN}
    for fields, reason in [
        ({"protocol": "bsp"}, "this server runs protocol 'asp', the worker 'bsp'"),
        ({"protocol": ["asp"]}, "a worker runs its server's protocol"),
        ({"numel": numel + 3}, f"model has {numel + 3} values, the server's {numel}"),
        ({"numel": True}, "a worker needs its server's model"),
    ]:
        await refused(client, "join", {**me, **fields}, 403, reason)
    assert not client.server.core.store.live and not client.server.core.workers[0].session
    secret = await client.join_with({**me, "protocol": "asp", "numel": numel})
    assert client.server.core.workers[0].session == secret


@pytest.mark.parametrize("header", [
    {"run_id": "another run", "session": "S"}, {"worker": 5, "session": "S"},
    {"session": "forged"}, {"session": None},
], ids=["wrong run", "unknown rank", "forged secret", "no secret"])
async def test_a_push_from_no_session_is_refused_before_its_tensor_is_received(
    client: Client, header: dict[str, Any],
) -> None:
    """Only a session's holder makes the server take a model-sized vector and receive a
    tensor into it: the refusal comes when the frame's header has arrived, before the
    tensor (here never sent)."""
    secret = await client.join(0)
    push = {**client.push(0, secret), **header}
    push["session"] = secret if push["session"] == "S" else push["session"]
    push = {key: value for key, value in push.items() if value is not None}
    body = frame(push, client.gradient())
    head_bytes = PREFIX.size + PREFIX.unpack(body[:PREFIX.size])[0]
    taken = client.server.core.buffers.allocated + client.server.core.buffers.reused
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(f"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:head_bytes])
    status_line = await asyncio.wait_for(reader.readline(), 30)
    writer.close()
    assert status_line.split()[1] in (b"403", b"410"), status_line
    core = client.server.core
    assert core.buffers.allocated + core.buffers.reused == taken
    assert core.store.version == 0


async def test_on_a_stream_too_a_push_from_no_session_is_refused_before_its_tensor(
    client: Client,
) -> None:
    await client.join(0)
    core = client.server.core
    taken = core.buffers.allocated + core.buffers.reused
    body = frame(client.push(0, "forged"), client.gradient())
    head_bytes = PREFIX.size + PREFIX.unpack(body[:PREFIX.size])[0]
    stream = await StreamConnection.open(client.server.url, None, None, None)
    try:
        async def head() -> AsyncIterator[bytes]:
            yield body[:head_bytes]

        await stream.send("push", len(body), head())  # declares the tensor, never sends it
        status, length = await asyncio.wait_for(stream.reply(), 30)
        reason = await stream.receiver.read_exactly(length)
    finally:
        stream.close()
    assert (status, b"session secret" in reason) == (403, True)
    assert core.buffers.allocated + core.buffers.reused == taken
