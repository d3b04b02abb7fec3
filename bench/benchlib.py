"""Shared pieces of the benchmarks: a server process with instrumentation, and helpers.

The server runs the real `ParameterServer` (aiohttp app, framing, validation, finite
check) with a "sink" protocol that accepts gradients without applying them, so transport
costs are measured without optimizer work. Its `query` operation reports the event loop's
lag (a 10 ms heartbeat task) and the process's peak resident memory.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import NoParams, Protocol, Push, ServerRule, WorkerLoop
from asyncsync.transport.connection_gate import ConnectionLimits
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer

RUN = "bench"


def rss_bytes(field: str) -> int:
    """VmRSS or VmHWM of this process, from /proc (Linux)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


class LagMonitor:
    """Measures how late a 10 ms periodic task wakes up (event-loop lag).

    Beside each lag it records the loop thread's CPU time over that period (user and
    system): the part of a lag the loop's own work can explain is at most that, the rest is
    the process waiting for a core (on a 2-core machine with 9 busy processes, the OS's).
    It also times the process's garbage collections (`gc.callbacks`): the longest, in
    CPU time of the collecting thread, so a busy host does not lengthen it.
    """

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.own: list[float] = []
        self.collections: list[float] = []
        self.recording = False
        self._collecting = 0.0
        gc.callbacks.append(self._collection)

    def _collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting = time.thread_time()
        elif self.recording:
            self.collections.append(time.thread_time() - self._collecting)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + 0.01
            cpu = time.thread_time()
            await asyncio.sleep(0.01)
            if self.recording:
                lag = max(0.0, loop.time() - expected)
                self.samples.append(lag)
                self.own.append(min(lag, time.thread_time() - cpu))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SinkRule(ServerRule):
    """Accepts gradients and drops them; `query` drives the instrumentation."""

    push_kinds = frozenset({"gradient"})
    monitor = LagMonitor()
    rss_before = 0

    async def on_push(self, push: Push) -> dict[str, Any]:
        return {}

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        cmd = meta.get("cmd")
        if cmd == "record":
            SinkRule.monitor.samples = []
            SinkRule.monitor.own = []
            SinkRule.monitor.collections = []
            SinkRule.monitor.recording = True
            with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
                handle.write("5")  # reset VmHWM to the current RSS
            SinkRule.rss_before = rss_bytes("VmRSS")
            return {}
        if cmd == "report":
            SinkRule.monitor.recording = False
            lags, own = SinkRule.monitor.samples, SinkRule.monitor.own
            return {"p50_ms": 1000 * percentile(lags, 0.5),
                    "p99_ms": 1000 * percentile(lags, 0.99),
                    "own_p99_ms": 1000 * percentile(own, 0.99),
                    "gc_count": len(SinkRule.monitor.collections),
                    "gc_max_ms": 1000 * max(SinkRule.monitor.collections, default=0.0),
                    "peak_extra_bytes": rss_bytes("VmHWM") - SinkRule.rss_before}
        return {}


class IdleLoop(WorkerLoop):
    async def run(self, ctx: Any) -> None:
        raise NotImplementedError("benchmark clients drive the transport directly")


SINK = Protocol("bench-sink", "benchmark sink", NoParams, SinkRule, IdleLoop)


def serve(numel: int, workers: int, port: Any, done: Any, connections: int | None = None,
          ) -> None:
    """Server process body: serve a model of `numel` floats until `done` is set, admitting
    `connections` connections from loopback if given (the default limits otherwise)."""
    torch.set_num_threads(1)

    async def main() -> None:
        model = torch.nn.Linear(numel, 1, bias=False)
        settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
        limits = None if connections is None else ConnectionLimits(
            max_connections=connections, max_per_peer=connections)
        server = ParameterServer(model, SINK, workers, settings, connections=limits)
        await server.start()
        monitor = asyncio.create_task(SinkRule.monitor.run())
        port.value = server.port
        while not done.is_set():
            await asyncio.sleep(0.05)
        monitor.cancel()
        await server.stop()  # the clients are done: end the run, so close() has none to warn of
        await server.close()

    asyncio.run(main())


def start_server(numel: int, workers: int = 1, connections: int | None = None,
                 ) -> tuple[mp.process.BaseProcess, int, Any]:
    """Start `serve` in a spawned process; returns (process, port, done event)."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    done = ctx.Event()
    proc = ctx.Process(target=serve, args=(numel, workers, port, done, connections))
    proc.start()
    while port.value == 0:
        if not proc.is_alive():
            raise RuntimeError("benchmark server failed to start")
        time.sleep(0.05)
    return proc, int(port.value), done


class SessionClient:
    """An `HttpTransport` that sends its join's session secret with every request."""

    def __init__(self, transport: HttpTransport) -> None:
        self.transport = transport
        self.session = ""

    async def request(self, op: str, header: dict[str, Any],
                      vector: torch.Tensor | None = None,
                      ) -> tuple[dict[str, Any], torch.Tensor | None]:
        return await self.transport.request(op, {**header, "session": self.session}, vector)

    async def close(self) -> None:
        await self.transport.close()


async def joined_client(port: int, numel: int, rank: int,
                        channel: str = "stream") -> SessionClient:
    """Worker `rank`, joined, its requests on `channel` (``stream`` or ``http``)."""
    client = SessionClient(HttpTransport(f"http://127.0.0.1:{port}", numel, channel=channel))
    reply, _ = await client.request("join", {"worker": rank, "run_id": RUN})
    client.session = str(reply["meta"]["session"])
    return client


def push_header(rank: int) -> dict[str, Any]:
    return {"worker": rank, "run_id": RUN, "base_version": 0, "kind": "gradient",
            "steps": 1, "samples": 1}


def median(values: list[float]) -> float:
    return statistics.median(values)


async def instrument(client: SessionClient, cmd: str) -> dict[str, Any]:
    """Send a sink-rule command as worker 0: "record" starts measuring, "report" returns
    loop-lag percentiles and peak memory since "record"."""
    reply, _ = await client.request("query", {"worker": 0, "run_id": RUN, "meta": {"cmd": cmd}})
    return dict(reply["meta"])


def cli_run(workdir: Path, recipe: Path, overrides: list[str]) -> list[Path]:
    """Run `recipe` through ``asyncsync run`` as a user would (logs under `workdir`, each
    `overrides` item passed as ``--set``); returns its run directories in the recipe's
    order. Exits with the CLI's output when it fails."""
    args = [sys.executable, "-m", "asyncsync", "run", str(recipe), "--logs",
            str(workdir / "logs"), "--plain"]
    for item in overrides:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    stamps = sorted((workdir / "logs").glob("*/*/recipe.json"))
    if done.returncode != 0 or not stamps:
        sys.exit(f"asyncsync run failed ({done.returncode}):\n{done.stdout[-3000:]}"
                 f"{done.stderr[-3000:]}")
    root = stamps[-1].parent
    names = [run["name"] for run in json.loads(stamps[-1].read_text())["runs"]]
    return [root / name for name in names]
