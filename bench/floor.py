"""Floor benchmark: what one exchange costs, layer by layer, from a raw socket up.

Run: ``.venv/bin/python bench/floor.py`` (about 1 minute on 2 cores).

One exchange sends a vector of the given size to a server process on loopback and
receives one of the same size back (0.55 MB: the cnn's model, as one bsp step does; and
1 MB). Each row adds one layer to the row above it, each against its own server process:

1. raw: a 4-byte length then the bytes over an asyncio connection, received straight
   into a preallocated buffer (`asyncio.BufferedProtocol`) and echoed (no HTTP): the floor;
2. aiohttp: a bare aiohttp app echoing the body (``request.read()``), aiohttp's client;
3. framing: the same app reading and answering `asyncsync.wire.frames` frames into pooled
   tensors, driven by `HttpTransport`;
4. server: a real `ParameterServer` (tokens off, connection gate, the core's validation
   and session checks, NaN/Inf check) with the benchmark sink rule: a fused push + pull;
5. rule: the same with bsp applying an SGD step on each push;
6. copies: plus the worker's adoption of the pulled model (one copy into its parameters).

Rows 3-5 post an HTTP request per exchange (``channel="http"``). Beside the rows, in the
same rounds: ``websocket``, the bare app's echo over one WebSocket opened once (aiohttp's
client, which masks every frame it sends, as RFC 6455 requires); ``stream server`` and
``stream rule``, rows 4 and 5 over the stream channel (`frame_stream`, the default).

Prints, for each row, the median wall ms per exchange and the CPU ms per exchange of
client and server together (measured between two marks, so start-up is left out; on a
shared host the CPU column moves far less than the wall one), what each layer adds, and
its share of the last row. Rows run in alternating rounds (the host is shared), medians over all.
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

from asyncsync.engine.settings import ServerSettings
from asyncsync.training.buffers import VectorPool
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer, send_frame
from asyncsync.wire.frames import (
    PREFIX,
    FrameReader,
    Limits,
    encode_header,
    tensor_spec,
)

MB = 1_000_000
CNN_BYTES = 546_344
"""The cnn's model in float32 (bench/overhead.py's exchange, each way)."""
LAYERS = ("raw", "aiohttp", "framing", "server", "rule")
ALTERNATIVES = ("websocket", "stream server", "stream rule")
"""Measured in the same rounds as `LAYERS`, reported beside them (not a layer on top)."""
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

    async def echo_frames(request: web.Request) -> web.StreamResponse:
        socket = web.WebSocketResponse(max_msg_size=limits.max_body_bytes)
        await socket.prepare(request)
        async for message in socket:
            await socket.send_bytes(message.data)
        return socket

    async def frame(request: web.Request) -> web.StreamResponse:
        reader = FrameReader(request.content.readany, limits.max_body_bytes)
        header = await reader.header()
        nbytes = tensor_spec(header, limits)
        assert nbytes is not None
        vector = await reader.tensor(nbytes, limits.dtype, pool.take, check_finite=True)
        return await send_frame(request, encode_header({"version": 0}, vector), vector)

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_post("/v1/push", frame if framed else echo)
    app.router.add_get("/v1/ws", echo_frames)
    return app


def serve(layer: str, numel: int, port: Any, window: Any, cpu: Any) -> None:
    """Server process body for `layer` (see the module docstring): its CPU seconds between
    the client's two marks go to `cpu`."""
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
        elif layer in ("aiohttp", "framing", "websocket"):
            runner = web.AppRunner(aiohttp_app(numel, layer == "framing"), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port.value = runner.addresses[0][1]
            closers.append(runner.cleanup)
        else:
            model = torch.nn.Linear(numel, 1, bias=False)
            settings = ServerSettings(run_id=RUN, worker_timeout_s=None, lr=1e-3)
            ps = ParameterServer(model, SINK if layer.endswith("server") else "bsp", 1,
                                 settings)
            await ps.start()
            port.value = ps.port
            closers += [ps.stop, ps.close]  # the client is done: end the run, so close()
            # has no joined worker to warn of
        for mark in window[:2]:  # timed exchanges begin, then end
            while not mark.is_set():
                await asyncio.sleep(0.005)
            cpu.value = time.process_time() - cpu.value
        while not window[2].is_set():  # the client is done
            await asyncio.sleep(0.05)
        for close in closers:
            await close()

    asyncio.run(main())


async def client_for(layer: str, port: int, numel: int,
                     ) -> tuple[Exchange, Callable[[], Awaitable[None]]]:
    """One exchange of `layer` as a coroutine function, and how to close its client."""
    vector = torch.full((numel,), 1e-3)
    url = f"http://127.0.0.1:{port}"
    body = bytes(vector.numpy().data.cast("B"))  # the echo rows' payload
    if layer == "raw":
        loop = asyncio.get_running_loop()
        link, peer = await loop.create_connection(
            lambda: Echo(numel * 4, server=False), "127.0.0.1", port)
        message = memoryview(PREFIX.pack(numel * 4) + body)

        async def raw() -> None:
            peer.done = loop.create_future()
            link.write(message)
            await peer.done

        async def close_raw() -> None:
            link.close()
        return raw, close_raw
    if layer == "websocket":
        session = ClientSession()
        socket = await session.ws_connect(f"{url}/v1/ws",
                                         max_msg_size=Limits(numel).max_body_bytes)

        async def frame_echo() -> None:
            await socket.send_bytes(body)
            assert len((await socket.receive()).data) == len(body)

        async def close_ws() -> None:
            await socket.close()
            await session.close()
        return frame_echo, close_ws
    if layer == "aiohttp":
        session = ClientSession()

        async def echo() -> None:
            async with session.post(f"{url}/v1/push", data=body) as resp:
                await resp.read()
        return echo, session.close
    if layer == "framing":
        transport = HttpTransport(url, numel, channel="http")

        async def framed() -> None:
            await transport.request("push", {}, vector)
        return framed, transport.close
    channel = "stream" if layer.startswith("stream") else "http"
    client = SessionClient(HttpTransport(url, numel, channel=channel))
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


async def measure(layer: str, numel: int, repeats: int) -> tuple[list[float], float]:
    """Seconds of each of `repeats` exchanges of `layer`, after a warm-up, and the CPU
    seconds per exchange of client and server together (unlike wall time, hardly moved
    by other processes on a shared host)."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    server_cpu = ctx.Value("d", 0.0)
    window = (ctx.Event(), ctx.Event(), ctx.Event())
    proc = ctx.Process(target=serve, args=(layer, numel, port, window, server_cpu))
    proc.start()
    while port.value == 0:
        if not proc.is_alive():
            raise RuntimeError(f"the {layer} server failed to start")
        await asyncio.sleep(0.05)
    exchange, close = await client_for(layer, int(port.value), numel)
    times = []
    try:
        for _ in range(20):
            await exchange()
        window[0].set()
        await asyncio.sleep(0.05)  # the server notices the mark before the first exchange
        client_cpu = time.process_time()
        for _ in range(repeats):
            began = time.perf_counter()
            await exchange()
            times.append(time.perf_counter() - began)
        client_cpu = time.process_time() - client_cpu
        window[1].set()
        await asyncio.sleep(0.05)
    finally:
        await close()
        for mark in window:
            mark.set()
        await asyncio.to_thread(proc.join)
    return times, (client_cpu + server_cpu.value) / repeats


def adoption_s(numel: int, repeats: int) -> tuple[list[float], float]:
    """Seconds of each adoption (a pulled vector copied into a model's flat parameters),
    and CPU seconds per adoption."""
    flat = torch.zeros(numel)
    pulled = torch.full((numel,), 1e-3)
    times = []
    cpu = time.process_time()
    for _ in range(repeats):
        began = time.perf_counter()
        with torch.no_grad():
            flat.copy_(pulled)
        times.append(time.perf_counter() - began)
    return times, (time.process_time() - cpu) / repeats


def report(nbytes: int, rows: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    """Print one size's table: wall and CPU (client + server) ms per exchange."""
    medians = {layer: 1000 * statistics.median(times) for layer, times in rows.items()}
    cpu_ms = {layer: 1000 * statistics.median(per_round) for layer, per_round in cpu.items()}
    for table in (medians, cpu_ms):  # the copies row adds adoption to the rule row
        table["copies"] += table["rule"]
    size = f"{nbytes / MB:.2f} MB" if nbytes >= MB // 100 else f"{nbytes / 1000:g} kB"
    print(f"\n{size} each way: median ms per exchange")
    print(f"{'layer':>9} {'wall':>7} {'adds':>6} {'share':>6} {'cpu':>7} {'adds':>6} {'share':>6}")
    previous = previous_cpu = 0.0
    for layer in (*LAYERS, "copies"):
        added, added_cpu = medians[layer] - previous, cpu_ms[layer] - previous_cpu
        print(f"{layer:>9} {medians[layer]:>7.2f} {added:>6.2f} {added / medians['copies']:>6.0%}"
              f" {cpu_ms[layer]:>7.2f} {added_cpu:>6.2f} {added_cpu / cpu_ms['copies']:>6.0%}")
        previous, previous_cpu = medians[layer], cpu_ms[layer]
    for layer in ALTERNATIVES:
        instead = "aiohttp" if layer == "websocket" else layer.split()[-1]
        print(f"{layer:>13} {medians[layer]:>7.2f} {'':>13} {cpu_ms[layer]:>7.2f} (instead of the "
              f"{instead} row's {medians[instead]:.2f} / {cpu_ms[instead]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="exchanges per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[CNN_BYTES, MB],
                        help="bytes each way (a multiple of 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for nbytes in args.sizes:
        numel = nbytes // 4
        rows: dict[str, list[float]] = {layer: [] for layer in (*LAYERS, *ALTERNATIVES)}
        cpu: dict[str, list[float]] = {layer: [] for layer in rows}
        for _ in range(args.rounds):
            for layer in rows:
                times, cpu_s = asyncio.run(measure(layer, numel, args.repeats))
                rows[layer] += times
                cpu[layer].append(cpu_s)
        rows["copies"], adoption_cpu = adoption_s(numel, args.repeats)
        cpu["copies"] = [adoption_cpu]
        report(nbytes, rows, cpu)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
