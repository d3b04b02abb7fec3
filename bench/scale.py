"""Scale benchmark: one server, 8 to 1,000 workers pushing a tiny model as fast as they can.

Run: ``.venv/bin/python bench/scale.py`` (about 2 minutes on 2 cores).

Workers are coroutines spread over 4 client processes (64 full worker processes would
not fit in memory here; the server cannot tell the difference: each has its own HTTP
connection, session and rank). All connections come from one address, so the server
admits that many from one peer (a real deployment has one address per machine). Each
pushes a gradient and pulls the model in a loop, under asp semantics on the server's side
(the benchmark sink accepts every push); rank 0 only reads the instrumentation, so N
workers are N - 1 pushing. Prints pushes/s the server sustains (one push and its pull
count once) and its ratio to the first worker count's in the same run, errors, the
server's event-loop lag, and its garbage collections (count, longest in CPU time).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from typing import Any

import torch
from benchlib import (
    RUN,
    SessionClient,
    instrument,
    joined_client,
    push_header,
    start_server,
)

NUMEL = 10_000
CLIENT_PROCESSES = 4


def client_process(port: int, ranks: list[int], seconds: float, start: Any,
                   counts: Any, channel: str) -> None:
    torch.set_num_threads(1)

    async def one(rank: int, client: SessionClient) -> tuple[int, int]:
        vector = torch.full((NUMEL,), 1e-3)
        pushes = errors = 0
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            try:
                await client.request("push", push_header(rank), vector)
                await client.request("pull", {"worker": rank, "run_id": RUN,
                                              "base_version": 0})
                pushes += 1
            except Exception:  # counted, not hidden: the benchmark reports errors
                errors += 1
        await client.close()
        return pushes, errors

    async def main() -> None:
        clients = await asyncio.gather(*(joined_client(port, NUMEL, rank, channel)
                                         for rank in ranks))
        with counts.get_lock():
            counts[2] += len(clients)
        await asyncio.to_thread(start.wait)
        results = await asyncio.gather(*(one(r, c) for r, c in zip(ranks, clients,
                                                                     strict=True)))
        with counts.get_lock():
            counts[0] += sum(p for p, _ in results)
            counts[1] += sum(e for _, e in results)

    asyncio.run(main())


async def measure(workers: int, seconds: float, channel: str,
                  ) -> tuple[float, int, dict[str, float]]:
    proc, port, done = start_server(NUMEL, workers, connections=2 * workers + 16)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    counts = ctx.Array("l", 3)  # pushes, errors, sessions joined
    ranks = list(range(1, workers))
    clients = [ctx.Process(target=client_process,
                           args=(port, ranks[i::CLIENT_PROCESSES], seconds, start, counts,
                                 channel))
               for i in range(CLIENT_PROCESSES)]
    for c in clients:
        c.start()
    control = await joined_client(port, NUMEL, 0)  # rank 0 reads the instrumentation
    while counts[2] < len(ranks):  # the joins are not part of the measurement
        await asyncio.sleep(0.05)
    await instrument(control, "record")
    began = time.monotonic()
    start.set()
    for c in clients:
        await asyncio.to_thread(c.join)
    elapsed = time.monotonic() - began
    lag = await instrument(control, "report")
    await control.close()
    done.set()
    proc.join()
    return counts[0] / elapsed, int(counts[1]), lag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64, 256, 1000])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--channel", choices=("stream", "http"), default="stream",
                        help="how the workers' requests travel (default: the stream)")
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    first = args.workers[0]
    print(f"{'workers':>7} {'pushes/s':>9} {f'x {first}':>7} {'errors':>6} {'lag p50 ms':>10} "
          f"{'lag p99 ms':>10} {'GCs':>5} {'GC max ms':>9}")
    reference = None
    for workers in args.workers:
        rate, errors, lag = asyncio.run(measure(workers, args.seconds, args.channel))
        reference = reference or rate
        print(f"{workers:>7} {rate:>9.0f} {rate / reference:>7.2f} {errors:>6} "
              f"{lag['p50_ms']:>10.1f} {lag['p99_ms']:>10.1f} {lag['gc_count']:>5.0f} "
              f"{lag['gc_max_ms']:>9.1f}", flush=True)
    print(f"pushes/s: push + pull pairs per second, all workers (rank 0 only reads the "
          f"instrumentation); x {first}: ratio to the {first}-worker row of this run")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
