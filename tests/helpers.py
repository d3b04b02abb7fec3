"""Small models, batch sources and run harnesses shared by the tests."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from asyncsync.hetero.compute import StepDelay
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.server import ParameterServer, ServerCore, build_core
from asyncsync.trainer import BatchSource
from asyncsync.transport.local import LocalTransport
from asyncsync.worker import Worker


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def tiny_data(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=gen)
    return x, (x[:, 0] > 0).long()


def batches_of(x: torch.Tensor, y: torch.Tensor, seed: int) -> BatchSource:
    gen = torch.Generator().manual_seed(seed)

    def next_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(y), (size,), generator=gen)
        return x[idx], y[idx]

    return next_batch


async def run_local(
    protocol: str,
    delays: list[float],
    *,
    params: Any = None,
    max_steps: int | None = None,
    time_s: float | None = None,
    link: LinkSpec | None = None,
    lr: float = 0.1,
    batch_size: int = 16,
) -> tuple[ServerCore, list[dict[str, Any]]]:
    """Run one in-process worker per step delay (seconds of sleep per local step).

    The run ends after `time_s` seconds, or as soon as the first worker reaches
    `max_steps` (the server then stops, so no worker blocks on a barrier that a finished
    peer will never reach). `link` shapes every worker's transport. Returns the server
    core (store, commits, staleness, blocked time) and each worker's final totals.
    """
    x, y = tiny_data()
    core = build_core(tiny_model(), protocol, len(delays), protocol_params=params, lr=lr,
                      time_s=time_s, test_data=(x, y), eval_interval_s=0.25)
    workers = [
        Worker(rank, LocalTransport(core, Link(link, seed=rank) if link else None),
               tiny_model(), batches_of(x, y, rank), protocol, protocol_params=params,
               lr=lr, batch_size=batch_size, slowdown=StepDelay(delay), max_steps=max_steps)
        for rank, delay in enumerate(delays)
    ]

    async def run(worker: Worker) -> dict[str, Any]:
        final = await worker.run()
        await core.stop()
        return final

    finals = await asyncio.gather(*(run(w) for w in workers))
    await core.close()
    return core, list(finals)


async def run_http(protocol: str, workers: int = 3, *, params: Any = None,
                   time_s: float = 1.5) -> tuple[ServerCore, list[dict[str, Any]]]:
    """A short end-to-end run over real HTTP on loopback (server and workers in-process)."""
    x, y = tiny_data()
    server = ParameterServer(tiny_model(), protocol, workers, protocol_params=params,
                             time_s=time_s, test_data=(x, y), eval_interval_s=0.25, lr=0.1)
    url = await server.start()
    try:
        nodes = [Worker(rank, url, tiny_model(), batches_of(x, y, rank), protocol,
                        protocol_params=params, lr=0.1, batch_size=16)
                 for rank in range(workers)]
        finals = await asyncio.gather(*(node.run() for node in nodes))
        await server.wait_finished()
    finally:
        await server.close()
    return server.core, list(finals)
