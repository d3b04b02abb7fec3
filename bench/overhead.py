"""Overhead benchmark: one worker under bsp through asyncsync vs a plain PyTorch loop.

Run: ``.venv/bin/python bench/overhead.py`` (about 2 minutes on 2 cores).

Both train the same cnn on the same synthetic data with the same batch and SGD settings,
one torch thread each. The asyncsync side is a real `ParameterServer` (HTTP on loopback,
separate process) and one `Worker`: each step computes a gradient, pushes it, the server
applies the SGD step, and the worker pulls and adopts the new model; once with requests
on the stream channel (the default), once with an HTTP POST each.

The host is shared and its speed drifts within a minute, so the runs alternate with
windows of the plain loop (`--rounds` rounds of stream and http): each run's ratio is
its steps/s over the mean of the plain windows just before and after it. Prints each
ratio and each channel's median (target: at least 0.85), and where a step's time goes,
summed over a channel's runs from the worker's final records.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.training.data import BatchSampler, synthetic
from asyncsync.training.models import build_model
from asyncsync.transport.http_server import ParameterServer

BATCH = 32
LR = 0.05
CHANNELS = ("stream", "http")


def plain_loop(seconds: float) -> float:
    """Steps/s of a plain PyTorch training loop."""
    data = synthetic(seed=0)
    torch.manual_seed(0)
    model = build_model("cnn", data.input_shape, data.num_classes, {})
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sampler = BatchSampler(data, torch.arange(len(data.train_y)), seed=0)
    steps, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        x, y = sampler(BATCH)
        optimizer.zero_grad()
        torch.autograd.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        steps += 1
    return steps / (time.perf_counter() - began)


def serve(seconds: float, port: Any) -> None:
    torch.set_num_threads(1)

    async def main() -> None:
        data = synthetic(seed=0)
        torch.manual_seed(0)
        model = build_model("cnn", data.input_shape, data.num_classes, {})
        settings = ServerSettings(lr=LR, time_s=seconds)
        async with ParameterServer(model, "bsp", 1, settings) as server:
            port.value = server.port
            await server.wait_finished()

    asyncio.run(main())


async def asyncsync_loop(seconds: float, channel: str,
                         server: Callable[..., None] = serve, *extra: Any) -> dict[str, Any]:
    """The final record of one bsp worker against a server process (`server(seconds,
    port, *extra)`), its requests on `channel`."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    proc = ctx.Process(target=server, args=(seconds, port, *extra))
    proc.start()
    while port.value == 0:
        await asyncio.sleep(0.05)
    data = synthetic(seed=0)
    model = build_model("cnn", data.input_shape, data.num_classes, {})
    sampler = BatchSampler(data, torch.arange(len(data.train_y)), seed=0)
    worker = Worker.connect(0, f"http://127.0.0.1:{port.value}", model, sampler, "bsp",
                    lr=LR, batch_size=BATCH, device="cpu", channel=channel)
    final = await worker.run()
    await asyncio.to_thread(proc.join)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="length of each asyncsync run (each plain window is half)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plains = [plain_loop(args.seconds / 2)]
    ratios: dict[str, list[float]] = {channel: [] for channel in CHANNELS}
    finals: dict[str, list[dict[str, Any]]] = {channel: [] for channel in CHANNELS}
    for _ in range(args.rounds):
        for channel in CHANNELS:
            final = asyncio.run(asyncsync_loop(args.seconds, channel))
            plains.append(plain_loop(args.seconds / 2))
            reference = (plains[-2] + plains[-1]) / 2  # the windows either side of the run
            ratios[channel].append(final["steps"] / final["wall_s"] / reference)
            finals[channel].append(final)
    print("plain PyTorch loop, steps/s: " + " / ".join(f"{p:.1f}" for p in plains))
    for channel in CHANNELS:
        runs = finals[channel]
        steps = sum(final["steps"] for final in runs)
        ms = {key: sum(final[f"{key}_s"] for final in runs) / steps * 1e3
              for key in ("wall", "compute", "comm", "held")}
        rest = ms["wall"] - ms["compute"] - ms["comm"] - ms["held"]
        print(f"asyncsync bsp, 1 worker, {channel} channel: ratio to the plain loop "
              + " / ".join(f"{r:.2f}" for r in ratios[channel])
              + f", median {statistics.median(ratios[channel]):.2f} (target >= 0.85); "
              f"per step {ms['wall']:.2f} ms: compute {ms['compute']:.2f} (adopting the "
              f"last model included), exchange {ms['comm'] + ms['held']:.2f} (of which the "
              f"server held it {ms['held']:.2f}: the rule, here the SGD step), the rest "
              f"{rest:.2f} (the loop)")


if __name__ == "__main__":
    main()
