"""Assembling a run from its `RunSpec`: data, model, the server and the workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from asyncsync.data import BatchSampler, Dataset, load_dataset
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.partition import partition
from asyncsync.metrics import JsonlLog
from asyncsync.models import build_model
from asyncsync.protocols.base import get_protocol
from asyncsync.recipe import RunSpec
from asyncsync.trainer import BatchSource
from asyncsync.transport.http_server import ParameterServer


def run_data(spec: RunSpec) -> Dataset:
    """The run's dataset (the same in every process: synthetic data comes from the seed)."""
    return load_dataset(spec.data.name, spec.seed, spec.data.root, spec.data.download)


def run_model(spec: RunSpec, data: Dataset) -> torch.nn.Module:
    """The run's model, initialised from the run's seed."""
    torch.manual_seed(spec.seed)
    return build_model(spec.model.name, data.input_shape, data.num_classes, spec.model.options)


def build_server(spec: RunSpec, run_id: str, log_dir: Path | None, host: str = "127.0.0.1",
                 port: int = 0) -> ParameterServer:
    """The parameter server of one run, as the CLI's ``server`` command starts it."""
    data = run_data(spec)
    events = JsonlLog(log_dir / "events.jsonl" if log_dir else None)
    return ParameterServer(
        run_model(spec, data), get_protocol(spec.protocol.name), spec.workers,
        server_settings(spec, run_id, log_dir), host=host, port=port,
        token=spec.resolved_token(), protocol_params=spec.protocol.params,
        test_data=(data.test_x, data.test_y), events=events)


def server_settings(spec: RunSpec, run_id: str, log_dir: Path | None) -> ServerSettings:
    """The server settings a run's recipe gives."""
    return ServerSettings(
        run_id=run_id, lr=spec.optim.lr, momentum=spec.optim.momentum,
        weight_decay=spec.optim.weight_decay, eval_interval_s=spec.eval.interval_s,
        time_s=spec.stop.time_s, target_accuracy=spec.stop.target_accuracy,
        stop_at_target=spec.stop.stop_at_target, worker_timeout_s=spec.fault.worker_timeout_s,
        checkpoint_path=checkpoint_file(log_dir) if spec.fault.checkpoint_s and log_dir
        else None, checkpoint_s=spec.fault.checkpoint_s or 10.0)


def batch_sources(spec: RunSpec, data: Dataset) -> Callable[[int], BatchSource]:
    """Each worker's batches, by rank: its partition of the training set, seeded per rank
    (the partition is drawn once)."""
    shards = partition(data.train_y, spec.workers, spec.data.partition, spec.seed,
                       spec.data.alpha, spec.data.classes_per_worker)
    return lambda rank: BatchSampler(data, shards[rank], seed=spec.seed * 1000 + rank).next


def checkpoint_file(log_dir: Path) -> Path:
    """Where a run's server keeps its checkpoint."""
    return log_dir / "checkpoint.npz"


def build_worker(spec: RunSpec, rank: int, url: str, run_id: str,
                 log_dir: Path | None, local_addr: str | None = None) -> Worker:
    """Worker `rank` of one run, as the CLI's ``worker`` command starts it."""
    if not 0 <= rank < spec.workers:
        raise ValueError(f"rank {rank} is outside 0..{spec.workers - 1}")
    data = run_data(spec)
    return Worker(
        rank, url, run_model(spec, data), batch_sources(spec, data)(rank),
        get_protocol(spec.protocol.name),
        protocol_params=spec.protocol.params, run_id=run_id, lr=spec.optim.lr,
        momentum=spec.optim.momentum, weight_decay=spec.optim.weight_decay,
        batch_size=spec.data.batch_size, slowdown=spec.compute_profile(rank), device=spec.device,
        link=spec.network.link(rank), local_addr=local_addr, token=spec.resolved_token(),
        heartbeat_s=spec.fault.heartbeat_s,
        log_path=log_dir / f"worker-{rank}.jsonl" if log_dir else None)


