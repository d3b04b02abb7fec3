"""Transport benchmark: asyncsync push + pull round trips against torch.distributed gloo.

Run: ``.venv/bin/python bench/transport.py`` (about 2 minutes on 2 cores).

1. Round trip (push then pull of the same size) between this process (the worker) and a
   server process on loopback, for 1, 10, 47 (ResNet-18 in fp32) and 180 MB, as two
   requests and as one fused exchange, against gloo send + recv of the same tensor between
   two processes, in the same run: GB/s and ratios.
2. Server event-loop lag (a 10 ms heartbeat) p50 / p99 while 8 worker processes push 47 MB
   at once.
3. Server peak memory during one 47 MB push, relative to the model size.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from benchlib import instrument, joined_client, median, push_header, start_server

MB = 1_000_000
SIZES_MB = (1, 10, 47, 180)
PARTS = ("trips", "lag", "memory")
SMALL_REPEATS = 20
"""More round trips at 1 MB, where one takes about a millisecond and the noise is large."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def asyncsync_round_trips(numel: int, repeats: int, fused: bool, channel: str) -> float:
    """Median seconds of one push + pull of `numel` floats on `channel`: two requests, or
    one fused exchange (a push with ``then_pull``, as the barrier protocols send)."""
    proc, port, done = start_server(numel)
    client = await joined_client(port, numel, 0, channel)
    vector = torch.full((numel,), 1e-3)
    times = []
    try:
        for _ in range(repeats + 2):  # the first two warm up connections and the pools
            began = time.perf_counter()
            if fused:
                _, pulled = await client.request("push", {**push_header(0), "then_pull": True},
                                                 vector)
            else:
                await client.request("push", push_header(0), vector)
                _, pulled = await client.request("pull", {"worker": 0, "run_id": "bench",
                                                          "base_version": 0})
            times.append(time.perf_counter() - began)
            assert pulled is not None and pulled.numel() == numel
    finally:
        await client.close()
        done.set()
        proc.join()
    return median(times[2:])


def gloo_peer(rank: int, port: int, numel: int, repeats: int, result: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    tensor = torch.full((numel,), 1e-3)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        began = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        else:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
        times.append(time.perf_counter() - began)
    if rank == 0:
        result.value = median(times[1:])
    dist.destroy_process_group()


def gloo_round_trips(numel: int, repeats: int) -> float:
    """Median seconds of a send + recv of `numel` floats between two gloo processes."""
    ctx = mp.get_context("spawn")
    result = ctx.Value("d", 0.0)
    port = free_port()
    procs = [ctx.Process(target=gloo_peer, args=(rank, port, numel, repeats, result))
             for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return float(result.value)


def pusher(port: int, numel: int, rank: int, rounds: int, start: Any, channel: str) -> None:
    torch.set_num_threads(1)

    async def main() -> None:
        client = await joined_client(port, numel, rank, channel)
        vector = torch.full((numel,), 1e-3)
        start.wait()
        for _ in range(rounds):
            await client.request("push", push_header(rank), vector)
        await client.close()

    asyncio.run(main())


async def lag_under_load(numel: int, workers: int, rounds: int, channel: str,
                         ) -> dict[str, float]:
    """Loop lag while `workers` processes push `numel` floats at once, `rounds` times."""
    proc, port, done = start_server(numel, workers)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    pushers = [ctx.Process(target=pusher, args=(port, numel, rank + 1, rounds, start, channel))
               for rank in range(workers - 1)]
    for p in pushers:
        p.start()
    control = await joined_client(port, numel, 0, channel)  # worker 0 drives the probe
    try:
        await instrument(control, "record")
        start.set()
        vector = torch.full((numel,), 1e-3)
        for _ in range(rounds):
            await control.request("push", push_header(0), vector)
        for p in pushers:
            await asyncio.to_thread(p.join)
        lag = await instrument(control, "report")
    finally:
        await control.close()
        done.set()
        proc.join()
    return lag


async def peak_memory(numel: int, channel: str) -> float:
    """Extra server memory during one push, as a multiple of the model size."""
    proc, port, done = start_server(numel)
    client = await joined_client(port, numel, 0, channel)
    vector = torch.full((numel,), 1e-3)
    try:
        await client.request("push", push_header(0), vector)  # warm up
        await instrument(client, "record")
        await client.request("push", push_header(0), vector)
        report = await instrument(client, "report")
    finally:
        await client.close()
        done.set()
        proc.join()
    return float(report["peak_extra_bytes"]) / (numel * 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES_MB),
                        help="message sizes in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which measurements to run (default: all)")
    parser.add_argument("--channel", choices=("stream", "http"), default="stream",
                        help="how the requests travel (default: the stream, as workers')")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "trips" in args.parts:
        round_trips(args.sizes, args.repeats, args.channel)
    numel = 47 * MB // 4
    if "lag" in args.parts:
        lag = asyncio.run(lag_under_load(numel, workers=8, rounds=3, channel=args.channel))
        print(f"server loop lag with 8 concurrent 47 MB pushes: p50 {lag['p50_ms']:.1f} ms, "
              f"p99 {lag['p99_ms']:.1f} ms (target p99 < 20 ms); the loop's own work explains "
              f"at most p99 {lag['own_p99_ms']:.1f} ms of it (thread CPU time in the period); "
              f"{lag['gc_count']:.0f} garbage collections, the longest "
              f"{lag['gc_max_ms']:.1f} ms of CPU")
    if "memory" in args.parts:
        ratio = asyncio.run(peak_memory(numel, args.channel))
        print(f"server peak extra memory during one 47 MB push: {ratio:.2f}x the model size "
              f"(counting the model itself: {ratio + 1:.2f}x; target <= 2x)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def round_trips(sizes: list[int], repeats: int, channel: str) -> None:
    """Print the round-trip table (part 1 of the module docstring) for `channel`."""
    print(f"round trips on the {channel} channel")
    print(f"{'size':>7} {'push+pull GB/s':>15} {'exchange GB/s':>14} {'gloo GB/s':>10} "
          f"{'ratio':>6} {'exch. ratio':>11}")
    for size in sizes:
        numel = size * MB // 4
        runs = max(2, repeats * SMALL_REPEATS if size <= 1 else
                   repeats if size <= 47 else repeats // 2)
        ours = asyncio.run(asyncsync_round_trips(numel, runs, False, channel))
        fused = asyncio.run(asyncsync_round_trips(numel, runs, True, channel))
        gloo = gloo_round_trips(numel, runs)
        moved = 2 * numel * 4 / 1e9
        target = {1: "  (target >= 0.6)", 47: "  (target >= 0.5)"}.get(size, "")
        print(f"{size:>5}MB {moved / ours:>15.2f} {moved / fused:>14.2f} {moved / gloo:>10.2f} "
              f"{gloo / ours:>6.2f} {gloo / fused:>11.2f}{target}", flush=True)


if __name__ == "__main__":
    main()
