"""Virtual-time runs: one run's server core and all its workers in this process, on a
`VirtualTimeLoop`, talking through the in-process transport (real frames, no sockets).

The protocol code, the engine, the compute profiles and the link model are the same as in
real mode; only the clock and the two compute seams differ. Each local step runs its real
torch math inline and is charged ``base_step_s x slowdown`` (scaled by its batch size) in
virtual seconds; each message pays latency and bytes / bandwidth in virtual seconds. The
base step time is the recipe's ``compute.base_step_s``, or else the median of a few real
steps of the run's model and batch size on this host (written to summary.json).
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncsync.assembly import batch_source, run_data, run_model, server_settings
from asyncsync.clock import VirtualTimeLoop, wall
from asyncsync.engine.compute import InlineServerSeam, VirtualWorkerSeam
from asyncsync.engine.core import build_core
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import build_profile
from asyncsync.hetero.network import Link, ServerLink
from asyncsync.metrics import JsonlLog
from asyncsync.protocols.base import get_protocol
from asyncsync.recipe import RunSpec
from asyncsync.trainer import Trainer
from asyncsync.transport.local import LocalTransport

StatusSink = Callable[[dict[str, Any]], None]
CALIBRATION_STEPS = 7


def calibrate_step_s(spec: RunSpec) -> float:
    """The median wall time of a few real local steps of the run's model and batch size on
    this host (after one warm-up step)."""
    data = run_data(spec)
    trainer = Trainer(run_model(spec, data), batch_source(spec, data, 0), spec.optim.lr,
                      device="cpu")
    trainer.local_step(spec.data.batch_size)
    seconds = []
    for _ in range(CALIBRATION_STEPS):
        began = wall()
        trainer.local_step(spec.data.batch_size)
        seconds.append(wall() - began)
    return statistics.median(seconds)


def simulate(spec: RunSpec, run_dir: Path, run_id: str, base_step_s: float,
             status: StatusSink | None = None) -> dict[str, Any]:
    """Run `spec` in virtual time, writing the same logs as a real run; returns the facts
    a summary adds (base step time, real seconds taken, virtual seconds per real one)."""
    torch.set_num_threads(1)
    loop = VirtualTimeLoop()
    began = wall()
    try:
        virtual_s = loop.run_until_complete(_run(spec, run_dir, run_id, base_step_s, status))
    finally:
        loop.close()
    real_s = wall() - began
    return {"clock": "virtual", "base_step_s": base_step_s, "real_s": round(real_s, 3),
            "virtual_per_real": round(virtual_s / real_s, 3) if real_s > 0 else None}


async def _run(spec: RunSpec, run_dir: Path, run_id: str, base_step_s: float,
               status: StatusSink | None) -> float:
    data = run_data(spec)
    protocol = get_protocol(spec.protocol.name)
    core = build_core(run_model(spec, data), protocol, spec.workers,
                      server_settings(spec, run_id, None), protocol_params=spec.protocol.params,
                      test_data=(data.test_x, data.test_y),
                      events=JsonlLog(run_dir / "events.jsonl"), seam=InlineServerSeam())
    server_link = ServerLink(spec.network.server_mbps) if spec.network.server_mbps else None
    workers = []
    for rank in range(spec.workers):
        factor = spec.compute.slowdown[rank] if rank < len(spec.compute.slowdown) else 1.0
        profile = build_profile(spec.compute.profile, factor, 0.0, rank, spec.workers,
                                spec.seed)
        link_spec = spec.network.link(rank)
        link = Link(link_spec, seed=spec.seed * 1000 + rank) if link_spec.shaped else None
        workers.append(Worker(
            rank, LocalTransport(core, link, server_link), run_model(spec, data),
            batch_source(spec, data, rank), protocol, protocol_params=spec.protocol.params,
            run_id=run_id, lr=spec.optim.lr, momentum=spec.optim.momentum,
            weight_decay=spec.optim.weight_decay, batch_size=spec.data.batch_size,
            device="cpu", heartbeat_s=spec.fault.heartbeat_s,
            log_path=run_dir / f"worker-{rank}.jsonl",
            seam=VirtualWorkerSeam(profile, base_step_s, spec.data.batch_size)))
    began = wall()

    def progress() -> dict[str, Any]:
        real_s = wall() - began
        return {**core.status(),
                "virtual_per_real": core.elapsed() / real_s if real_s > 0 else None}

    reporter = asyncio.create_task(_report(progress, status)) if status else None
    try:
        await asyncio.gather(*(worker.run() for worker in workers))
        await core.stop()
        return core.elapsed()
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        await core.close()


async def _report(read: Callable[[], dict[str, Any]], sink: StatusSink) -> None:
    """Hand the core's status to the supervisor every virtual second."""
    while True:
        sink(read())
        await asyncio.sleep(1.0)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json of a run."""
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
