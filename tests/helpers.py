"""Small models, batch sources and run harnesses shared by the tests."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.engine.compute import ThreadedWorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import Commit
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import StepDelay
from asyncsync.hetero.network import LinkSpec
from asyncsync.study.simulation import run_virtual
from asyncsync.training.trainer import BatchSource
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport


def keep_every_commit(core: ServerCore) -> ServerCore:
    """Tests inspect the whole history: lift the store's bound on remembered commits."""
    core.store.commits = deque(core.store.commits)
    return core


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
    """`asyncsync.study.simulation.run_virtual` of the tiny model, steps of `STEP_S`, the whole
    commit history kept, in a thread (so async tests can call it)."""
    x, y = tiny_data()

    def simulate() -> tuple[ServerCore, list[dict[str, Any]]]:
        return run_virtual(
            protocol, tiny_model, lambda rank: batches_of(x, y, rank), delays,
            settings=ServerSettings(lr=lr, time_s=time_s, eval_interval_s=0.25),
            params=params, step_s=STEP_S, batch_size=batch_size, link=link,
            max_steps=max_steps, test_data=(x, y),
            prepare=keep_every_commit)

    return await asyncio.to_thread(simulate)


STEP_S = 0.001
"""The virtual duration of one local step of the tiny model, before its worker's delay."""
SLOW_LINK = LinkSpec(uplink_mbps=0.05, downlink_mbps=0.012, latency_ms=5)
"""A link slower than computation: pulling the model (~0.8 kB with its header) takes
~0.55 s, over three 0.15 s steps; pushing a delta (~1 kB with its header) ~0.17 s."""
SLOW_LINK_DELAYS = [0.15, 0.15, 0.4]
"""Step delays of the overlap checks behind `SLOW_LINK`."""


async def run_workers(core: ServerCore, workers: list[Worker]) -> list[dict[str, Any]]:
    """Run `workers` against `core`; the first to end (e.g. at its step limit) stops the
    run, so nobody waits at a barrier for a finished peer. Closes the core."""

    async def run(worker: Worker) -> dict[str, Any]:
        final = await worker.run()
        await core.stop()
        return final

    finals = await asyncio.gather(*(run(w) for w in workers))
    await core.close()
    return list(finals)


async def run_http(protocol: str, workers: int = 3, *, params: Any = None,
                   time_s: float = 1.5) -> tuple[ServerCore, list[dict[str, Any]]]:
    """A short end-to-end run over real HTTP on loopback (server and workers in-process)."""
    x, y = tiny_data()
    server = ParameterServer(tiny_model(), protocol, workers,
                             ServerSettings(lr=0.1, time_s=time_s, eval_interval_s=0.25),
                             protocol_params=params, test_data=(x, y))
    keep_every_commit(server.core)
    url = await server.start()
    try:
        nodes = [Worker.connect(rank, url, tiny_model(), batches_of(x, y, rank), protocol,
                        protocol_params=params, lr=0.1, batch_size=16)
                 for rank in range(workers)]
        finals = await asyncio.gather(*(node.run() for node in nodes))
        await server.wait_finished()
    finally:
        await server.close()
    return server.core, list(finals)


class CuttableTransport(LocalTransport):
    """A `LocalTransport` that can be cut, like the socket of a crashed process: every
    request then fails (so a worker being killed sends no leave)."""

    cut = False

    async def request(
        self, op: str, header: dict[str, Any], vector: torch.Tensor | None = None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        if self.cut:
            raise ConnectionError("the worker crashed")
        return await super().request(op, header, vector)


@dataclass
class CrashRun:
    """What `run_crash_and_rejoin` observed: the version when the loss was seen, and the one
    when the fresh worker was started (no later commit is older than its rejoin)."""

    core: ServerCore
    victim: int
    lost_at: int
    restarted_at: int

    def between(self, first: int, last: int) -> list[Commit]:
        """The commits of versions ``first..last``."""
        return [c for c in self.core.store.commits if first <= c.version <= last]


def ranks(commit: Commit) -> set[int]:
    """The workers that contributed to `commit`."""
    return {worker for worker, _ in commit.contributions}


async def _until(ready: Callable[[], bool], what: str, timeout_s: float,
                 tasks: list[asyncio.Task[dict[str, Any]]]) -> None:
    """Poll `ready`; fail with the error of a worker that failed, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"a worker failed while waiting for {what}") from (
                    task.exception())
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def run_crash_and_rejoin(
    protocol: str,
    delays: list[float],
    victim: int,
    *,
    params: Any = None,
    before: int = 3,
    after: int = 3,
    timeout_s: float = 15.0,
) -> CrashRun:
    """Kill worker `victim` mid-run, let the server drop it, then start a fresh worker with
    its rank and wait until a commit includes it again.

    In process, with a 0.5 s worker timeout and 0.1 s heartbeats. The victim is killed
    after `before` versions: its transport is cut and its `Worker.run` task cancelled, so it
    sends neither a leave nor heartbeats. The fresh worker starts once the server has
    logged the loss and made `after` more versions. Each phase must finish within
    `timeout_s` (an `AssertionError` names the phase that did not).
    """
    x, y = tiny_data()
    core = keep_every_commit(build_core(tiny_model(), protocol, len(delays),
                                        ServerSettings(lr=0.1, worker_timeout_s=0.5),
                                        protocol_params=params))

    def start(rank: int, transport: LocalTransport) -> asyncio.Task[dict[str, Any]]:
        worker = Worker(rank, transport, tiny_model(), batches_of(x, y, rank), protocol,
                        protocol_params=params, lr=0.1, batch_size=16,
                        seam=ThreadedWorkerSeam(StepDelay(delays[rank])), heartbeat_s=0.1)
        return asyncio.create_task(worker.run())

    transports = [CuttableTransport(core) for _ in delays]
    tasks = [start(rank, transport) for rank, transport in enumerate(transports)]
    store = core.store
    try:
        await _until(lambda: store.version >= before, f"{before} versions", timeout_s, tasks)
        transports[victim].cut = True
        tasks[victim].cancel()
        await asyncio.gather(tasks[victim], return_exceptions=True)
        await _until(lambda: core.workers[victim].lost > 0, "the loss", timeout_s, tasks)
        lost_at = store.version
        await _until(lambda: store.version >= lost_at + after,
                     f"{after} versions after the loss", timeout_s, tasks)
        restarted_at = store.version
        tasks[victim] = start(victim, LocalTransport(core))
        await _until(lambda: victim in store.live, "the rejoin", timeout_s, tasks)
        await _until(lambda: any(victim in ranks(c) for c in store.commits
                                 if c.version > restarted_at),
                     "a commit including the rejoined worker", timeout_s, tasks)
    finally:
        await core.stop()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await core.close()
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    return CrashRun(core, victim, lost_at, restarted_at)


def tiny_bn_cnn(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A recipe model (``tests.helpers:tiny_bn_cnn``) with BatchNorm: its running
    statistics are buffers that every worker keeps and updates."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(input_shape[0], 4, 3, stride=2, padding=1), torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
        torch.nn.Linear(64, num_classes))


def dropout_mlp(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A recipe model (``tests.helpers:dropout_mlp``) that a batched call cannot run:
    dropout draws random numbers, which ``vmap`` refuses by default."""
    features = 1
    for size in input_shape:
        features *= size
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(features, num_classes))
