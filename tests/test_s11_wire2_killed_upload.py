"""A worker killed (its connection reset) in the middle of uploading a push, over HTTP or
on a stream: the half push changes nothing, its body slot is given back, and the run goes
on (the other worker's pushes and the rank's next session are served)."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import aiohttp
import msgpack
import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.frame_stream import PATH as STREAM_PATH
from asyncsync.transport.frame_stream import REQUEST
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire.frames import CONTENT_TYPE, PREFIX, decode_header, encode_header, tensor_chunks
from tests.helpers import tiny_model

RUN = "killed"
WITHIN_S = 60.0
"""How long the server may take to notice a reset connection (it takes milliseconds)."""


def frame(header: dict[str, Any], tensor: torch.Tensor | None = None) -> bytes:
    data = encode_header(header, tensor)
    return data + (b"" if tensor is None else b"".join(bytes(p) for p in tensor_chunks(tensor)))


def push(rank: int, session: str, seq: int, version: int) -> dict[str, Any]:
    return {"run_id": RUN, "worker": rank, "session": session, "seq": seq,
            "base_version": version, "kind": "gradient", "steps": 1, "samples": 1}


async def killed_mid_upload(port: int, body: bytes, stream: bool) -> None:
    """Send a push's head and part of its tensor, over HTTP or on a stream, then reset the
    connection (what the kernel does for a process killed with SIGKILL: its socket goes
    at once)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if stream:
        writer.write((f"POST {STREAM_PATH} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                      "Upgrade: tcp\r\nContent-Length: 0\r\n\r\n").encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        head = REQUEST.pack(4, len(body)) + b"push"
    else:
        head = (f"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
    writer.write(head + body[: len(body) // 2])
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def test_a_push_cut_mid_upload_changes_nothing_and_the_run_goes_on() -> None:
    limits = ConnectionLimits(max_bodies_per_rank=2)
    async with ParameterServer(tiny_model(), "asp", 2, ServerSettings(run_id=RUN, lr=1.0),
                               connections=limits) as server, aiohttp.ClientSession() as client:
        store = server.core.store
        headers = {"Content-Type": CONTENT_TYPE}

        async def post(op: str, body: bytes) -> tuple[int, bytes]:
            async with client.post(f"{server.url}/v1/{op}", data=body, headers=headers) as r:
                return r.status, await r.read()

        async def join(rank: int) -> str:
            status, raw = await post("join", frame({"run_id": RUN, "worker": rank}))
            assert status == 200, raw
            (size,) = PREFIX.unpack(raw[: PREFIX.size])
            return str(decode_header(raw[PREFIX.size : PREFIX.size + size])["meta"]["session"])

        sessions = await asyncio.gather(join(0), join(1))
        before = store.w.clone()
        gradient = torch.full((store.numel,), 0.5)
        # more cut uploads than the rank's body slots: a slot not given back would show
        for seq in range(1, 2 * limits.max_bodies_per_rank + 2):
            await killed_mid_upload(server.port, frame(push(0, sessions[0], seq, 0), gradient),
                                    stream=seq % 2 == 0)
        assert store.version == 0 and torch.equal(store.w, before)
        # the other worker goes on, and its push is the only one applied (lr 1: w - 0.5)
        status, raw = await post("push", frame(push(1, sessions[1], 1, 0), gradient))
        assert status == 200, raw
        assert store.version == 1
        assert torch.equal(store.w, before - 0.5)
        # the killed worker's restarted copy takes its rank over and pushes once its cut
        # bodies are all noticed (429 until then; a slot kept would keep it 429)
        fresh = await join(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WITHIN_S
        status, raw = await post("push", frame(push(0, fresh, 1, 1), gradient))
        while status == 429 and loop.time() < deadline:
            await asyncio.sleep(0.05)
            status, raw = await post("push", frame(push(0, fresh, 1, 1), gradient))
        assert status == 200, raw
        assert store.version == 2
        assert torch.equal(store.w, before - 0.5 - 0.5)
        assert msgpack.unpackb(raw[PREFIX.size:])["stop"] is False
