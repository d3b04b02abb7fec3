"""Floor benchmark: what one exchange costs, layer by layer, from a raw socket up.

Run: ``.venv/bin/python bench/floor.py`` (about 1 minute on 2 cores).

One exchange sends a vector of the given size to a server process on loopback and
receives one of the same size back (0.55 MB: the cnn's model, as one bsp step does; and
1 MB). Each row adds one layer to the row above it, each against its own server process:

1. raw: a 4-byte length then the bytes over an asyncio connection, received straight
   into a preallocated buffer (`asyncio.BufferedProtocol`) and echoed (no HTTP): the floor;
2. aiohttp: a bare aiohttp app echoing the body (``request.read()``), aiohttp's client;
3. framing: the same app reading and answering `asyncsync.wire` frames into pooled
   tensors, driven by `HttpTransport`;
4. server: a real `ParameterServer` (tokens off, connection gate, the core's validation
   and session checks, NaN/Inf check) with the benchmark sink rule: a fused push + pull;
5. rule: the same with bsp applying an SGD step on each push;
6. copies: plus the worker's adoption of the pulled model (one copy into its parameters).

Prints the median ms per exchange of each row, what each layer adds, and its share of
the last row. Rows run in alternating rounds (the host is shared), medians over all.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import torch
from aiohttp import ClientSession, web
from benchlib import RUN, SINK, SessionClient, push_header

from asyncsync.buffers import VectorPool
from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from asyncsync.wire import (
    CONTENT_TYPE,
    PREFIX,
    FrameReader,
    Limits,
    encode_header,
    frame_size,
    tensor_chunks,
    tensor_spec,
)

MB = 1_000_000
CNN_BYTES = 546_344
"""The cnn's model in float32 (bench/overhead.py's exchange, each way)."""
LAYERS = ("raw", "aiohttp", "framing", "server", "rule")
Exchange = Callable[[], Awaitable[None]]


class Echo(asyncio.BufferedProtocol):
    """Receives length-prefixed messages of a known size straight into one preallocated
    buffer (one kernel copy, none in Python) and, on the server, writes each back whole;
    the client's `done` resolves when a whole reply is in."""

    def __init__(self, nbytes: int, server: bool) -> None:
        self.buffer = bytearray(PREFIX.size + nbytes)
        self.view = memoryview(self.buffer)
        self.filled = 0
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled < len(self.buffer):
            return
        self.filled = 0
        if self.server:
            assert self.transport is not None
            self.transport.write(self.view)
        elif self.done is not None:
            self.done.set_result(None)


def aiohttp_app(numel: int, framed: bool) -> web.Application:
    """A bare app: echo the body, or read a frame into a pooled tensor and answer one."""
    pool = VectorPool()
    limits = Limits(numel)

    async def echo(request: web.Request) -> web.StreamResponse:
        return web.Response(body=await request.read())

    async def frame(request: web.Request) -> web.StreamResponse:
        reader = FrameReader(request.content.readany, limits.max_body_bytes)
        header = await reader.header()
        nbytes = tensor_spec(header, limits)
        assert nbytes is not None
        vector = await reader.tensor(nbytes, limits.dtype, pool.take, check_finite=True)
        head = encode_header({"version": 0}, vector)
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        response.content_length = frame_size(head, vector)
        await response.prepare(request)
        await response.write(head)
        for piece in tensor_chunks(vector):
            await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_post("/v1/push", frame if framed else echo)
    return app


def serve(layer: str, numel: int, port: Any, done: Any) -> None:
    """Server process body for `layer` (see the module docstring)."""
    torch.set_num_threads(1)

    async def main() -> None:
        closers: list[Callable[[], Awaitable[None]]] = []
        if layer == "raw":
            server = await asyncio.get_running_loop().create_server(
                lambda: Echo(numel * 4, server=True), "127.0.0.1", 0)
            port.value = server.sockets[0].getsockname()[1]

            async def close_raw() -> None:
                server.close()
            closers.append(close_raw)
        elif layer in ("aiohttp", "framing"):
            runner = web.AppRunner(aiohttp_app(numel, layer == "framing"), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port.value = runner.addresses[0][1]
            closers.append(runner.cleanup)
        else:
            model = torch.nn.Linear(numel, 1, bias=False)
            settings = ServerSettings(run_id=RUN, worker_timeout_s=None, lr=1e-3)
            ps = ParameterServer(model, SINK if layer == "server" else "bsp", 1, settings)
            await ps.start()
            port.value = ps.port
            closers.append(ps.close)
        while not done.is_set():
            await asyncio.sleep(0.05)
        for close in closers:
            await close()

    asyncio.run(main())


async def client_for(layer: str, port: int, numel: int,
                     ) -> tuple[Exchange, Callable[[], Awaitable[None]]]:
    """One exchange of `layer` as a coroutine function, and how to close its client."""
    vector = torch.full((numel,), 1e-3)
    url = f"http://127.0.0.1:{port}"
    if layer == "raw":
        loop = asyncio.get_running_loop()
        link, peer = await loop.create_connection(
            lambda: Echo(numel * 4, server=False), "127.0.0.1", port)
        message = memoryview(bytearray(PREFIX.pack(numel * 4)) + vector.numpy().tobytes())

        async def raw() -> None:
            peer.done = loop.create_future()
            link.write(message)
            await peer.done

        async def close_raw() -> None:
            link.close()
        return raw, close_raw
    if layer == "aiohttp":
        session = ClientSession()
        body = bytes(vector.numpy().data.cast("B"))

        async def echo() -> None:
            async with session.post(f"{url}/v1/push", data=body) as resp:
                await resp.read()
        return echo, session.close
    if layer == "framing":
        transport = HttpTransport(url, numel)

        async def framed() -> None:
            await transport.request("push", {}, vector)
        return framed, transport.close
    client = SessionClient(HttpTransport(url, numel))
    reply, _ = await client.request("join", {"worker": 0, "run_id": RUN})
    client.session = str(reply["meta"]["session"])
    header = {**push_header(0), "then_pull": True}

    async def exchange() -> None:
        reply, pulled = await client.request("push", {**header,
                                                      "base_version": version[0]}, vector)
        version[0] = int(reply["version"])
        assert pulled is not None

    version = [0]
    return exchange, client.close


async def measure(layer: str, numel: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` exchanges of `layer`, after a warm-up."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    done = ctx.Event()
    proc = ctx.Process(target=serve, args=(layer, numel, port, done))
    proc.start()
    while port.value == 0:
        if not proc.is_alive():
            raise RuntimeError(f"the {layer} server failed to start")
        await asyncio.sleep(0.05)
    exchange, close = await client_for(layer, int(port.value), numel)
    times = []
    try:
        for i in range(repeats + 20):
            began = time.perf_counter()
            await exchange()
            if i >= 20:
                times.append(time.perf_counter() - began)
    finally:
        await close()
        done.set()
        await asyncio.to_thread(proc.join)
    return times


def adoption_s(numel: int, repeats: int) -> list[float]:
    """Seconds of each adoption: a pulled vector copied into a model's flat parameters."""
    flat = torch.zeros(numel)
    pulled = torch.full((numel,), 1e-3)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        with torch.no_grad():
            flat.copy_(pulled)
        times.append(time.perf_counter() - began)
    return times


def report(nbytes: int, rows: dict[str, list[float]]) -> None:
    """Print one size's table."""
    medians = {layer: 1000 * statistics.median(times) for layer, times in rows.items()}
    total = medians["copies"] + medians["rule"]
    print(f"\n{nbytes / MB:.2f} MB each way: median ms per exchange")
    print(f"{'layer':>8} {'ms':>7} {'adds ms':>8} {'share':>6}")
    previous = 0.0
    for layer in (*LAYERS, "copies"):
        cumulative = medians[layer] + (medians["rule"] if layer == "copies" else 0.0)
        added = cumulative - previous
        print(f"{layer:>8} {cumulative:>7.2f} {added:>8.2f} {added / total:>6.0%}")
        previous = cumulative


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="exchanges per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for nbytes in (CNN_BYTES, MB):
        numel = nbytes // 4
        rows: dict[str, list[float]] = {layer: [] for layer in LAYERS}
        for _ in range(args.rounds):
            for layer in LAYERS:
                rows[layer] += asyncio.run(measure(layer, numel, args.repeats))
        rows["copies"] = adoption_s(numel, args.repeats)
        report(nbytes, rows)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
