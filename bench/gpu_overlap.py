"""GPU overlap benchmark: nbsync and bsp, 4 resnet18 workers sharing one GPU, 100 Mbit/s links.

Run on a CUDA host: ``.venv/bin/python bench/gpu_overlap.py`` (about 3 minutes with the
default 60 s per protocol). Without CUDA it exits at once and measures nothing.

Each protocol runs a real `ParameterServer` (CPU, HTTP on loopback, its own process) and 4
worker processes on the one GPU: resnet18 on the 32x32 synthetic images, batch 32, every
link shaped to 100 Mbit/s each way. Printed per protocol: the compute proportion (compute
seconds over wall seconds per worker, as the run summaries count it; target for nbsync:
>= 0.9) and, per local step, the time of the worker's device copies and how much of it
was hidden or exposed, timed with CUDA events. A device-to-host copy is exposed for as long
as its worker waited for it; a host-to-device copy for as long as the compute stream
stalled on it; the rest of each copy ran beside other work.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

import torch

from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.hetero.partition import partition
from asyncsync.training.data import BatchSampler, synthetic
from asyncsync.training.device_copies import CudaStreams, Event, Pairs, StagedCopies
from asyncsync.training.models import build_model
from asyncsync.transport.http_server import ParameterServer

PROTOCOLS = ("nbsync", "bsp")
WORKERS = 4
BATCH = 32
LR = 0.05
LINK_MBPS = 100.0
MODEL = "resnet18"


class TimedCopy:
    """One batch of side-stream copies: CUDA events around it, the host's wait for it and
    the compute stream's stall on it."""

    def __init__(self, to_host: bool) -> None:
        self.to_host = to_host
        self.start = torch.cuda.Event(enable_timing=True)
        self.done = torch.cuda.Event(enable_timing=True, blocking=True)
        self.stall: tuple[Any, Any] | None = None
        self.waited_s = 0.0

    def query(self) -> bool:
        return bool(self.done.query())

    def synchronize(self) -> None:
        began = time.perf_counter()
        self.done.synchronize()
        self.waited_s += time.perf_counter() - began

    def times_ms(self) -> tuple[float, float]:
        """``(copy, exposed)`` in milliseconds; only once the device is idle."""
        copy = float(self.start.elapsed_time(self.done))
        if self.to_host:
            exposed = 1000 * self.waited_s
        elif self.stall is not None:
            exposed = float(self.stall[0].elapsed_time(self.stall[1]))
        else:
            exposed = 0.0
        return copy, min(copy, exposed)


class TimedStreams(CudaStreams):
    """`CudaStreams` whose copies are timed (the same calls, plus timing events)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.copies: list[TimedCopy] = []

    def side_copy(self, pairs: Pairs) -> Event:
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        timed = TimedCopy(to_host=pairs[0][0].device.type == "cpu")
        timed.start.record(self.side)
        with torch.cuda.stream(self.side):
            for target, source in pairs:
                target.copy_(source, non_blocking=True)
        timed.done.record(self.side)
        self.copies.append(timed)
        return timed

    def compute_waits(self, event: Event) -> None:
        assert isinstance(event, TimedCopy)
        compute = torch.cuda.current_stream(self.device)
        before = torch.cuda.Event(enable_timing=True)
        after = torch.cuda.Event(enable_timing=True)
        before.record(compute)
        compute.wait_event(event.done)
        after.record(compute)
        event.stall = (before, after)

    def totals(self) -> dict[str, float]:
        """Copies, copy and exposed milliseconds, per direction (after a synchronize)."""
        out: dict[str, float] = {}
        for name, to_host in (("d2h", True), ("h2d", False)):
            times = [c.times_ms() for c in self.copies if c.to_host == to_host]
            out[f"{name}_copies"] = len(times)
            out[f"{name}_ms"] = sum(t[0] for t in times)
            out[f"{name}_exposed_ms"] = sum(t[1] for t in times)
        return out


def serve(protocol: str, seconds: float, port: Any) -> None:
    """Server process: the protocol's rule on the CPU for `seconds`, no evaluation."""
    torch.set_num_threads(1)

    async def main() -> None:
        data = synthetic(seed=0)
        torch.manual_seed(0)
        model = build_model(MODEL, data.input_shape, data.num_classes, {})
        settings = ServerSettings(lr=LR, time_s=seconds)
        async with ParameterServer(model, protocol, WORKERS, settings) as server:
            port.value = server.port
            await server.wait_finished()

    asyncio.run(main())


def work(rank: int, protocol: str, port: int, results: Any) -> None:
    """Worker process: one CUDA worker with timed copies; puts its totals on `results`."""
    torch.set_num_threads(1)

    async def main() -> dict[str, Any]:
        data = synthetic(seed=0)
        shard = partition(data.train_y, WORKERS, "iid", seed=0)[rank]
        model = build_model(MODEL, data.input_shape, data.num_classes, {})
        worker = Worker.connect(rank, f"http://127.0.0.1:{port}", model,
                                BatchSampler(data, shard, seed=rank), protocol, lr=LR,
                                batch_size=BATCH, device="cuda",
                                link=Link(LinkSpec(LINK_MBPS, LINK_MBPS), seed=rank))
        streams = TimedStreams(worker.trainer.device)
        worker.trainer.copies = StagedCopies(streams, worker.trainer.numel)
        final = await worker.run()
        torch.cuda.synchronize()  # after the run: every event is complete
        return {"compute_s": final["compute_s"], "wall_s": final["wall_s"],
                "steps": final["steps"], **streams.totals()}

    results.put(asyncio.run(main()))


def run_protocol(protocol: str, seconds: float) -> list[dict[str, Any]]:
    """One run: the server and `WORKERS` worker processes; each worker's totals."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    results = ctx.Queue()
    server = ctx.Process(target=serve, args=(protocol, seconds, port))
    server.start()
    while port.value == 0:
        if not server.is_alive():
            raise RuntimeError("the benchmark server failed to start")
        time.sleep(0.05)
    workers = [ctx.Process(target=work, args=(rank, protocol, int(port.value), results))
               for rank in range(WORKERS)]
    for process in workers:
        process.start()
    totals = [results.get(timeout=seconds + 300) for _ in workers]
    for process in [*workers, server]:
        process.join()
    return totals


def report(protocol: str, totals: list[dict[str, Any]]) -> float:
    """Print one protocol's figures; returns its mean compute proportion."""
    proportions = [t["compute_s"] / t["wall_s"] for t in totals if t["wall_s"] > 0]
    steps = max(1, sum(t["steps"] for t in totals))
    print(f"{protocol}: compute proportion {statistics.mean(proportions):.3f} (per worker: "
          f"{', '.join(f'{p:.3f}' for p in proportions)}), {steps} steps")
    for name, label in (("d2h", "device to host"), ("h2d", "host to device")):
        copies = sum(t[f"{name}_copies"] for t in totals)
        copy = sum(t[f"{name}_ms"] for t in totals) / steps
        exposed = sum(t[f"{name}_exposed_ms"] for t in totals) / steps
        print(f"  {label}: {copies} copies; per step {copy:.3f} ms copying, "
              f"{copy - exposed:.3f} ms hidden, {exposed:.3f} ms exposed")
    return float(statistics.mean(proportions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="budget of each run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_overlap.py needs a CUDA GPU, and torch.cuda.is_available() is "
                 "False here: nothing was measured.")
    print(f"GPU: {torch.cuda.get_device_name(0)}; {WORKERS} workers, {MODEL}, batch {BATCH}, "
          f"{LINK_MBPS:g} Mbit/s links, {args.seconds:g} s per protocol")
    proportion = {protocol: report(protocol, run_protocol(protocol, args.seconds))
                  for protocol in PROTOCOLS}
    print(f"nbsync / bsp compute proportion, this run: "
          f"{proportion['nbsync'] / proportion['bsp']:.2f}x; "
          "target: nbsync's compute proportion >= 0.9")


if __name__ == "__main__":
    main()
