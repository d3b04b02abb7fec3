"""Assembling a run from its `RunSpec`: data, model, the server and the workers."""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asyncsync.engine.channel import Dial, Transport, connect
from asyncsync.engine.compute import ThreadedWorkerSeam, WorkerSeam
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.capacity import Capacity
from asyncsync.hetero.compute import ComputeProfile, FixedStepCost, StepCost
from asyncsync.hetero.cost_model import (
    DeviceStepCost,
    ModelFlops,
    count_step_flops,
    optimizer_flops_per_param,
)
from asyncsync.hetero.network import Link
from asyncsync.hetero.partition import partition
from asyncsync.protocols.base import get_protocol
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.schema import ConfigError
from asyncsync.study.specs import TIMING_MODEL, RunSpec
from asyncsync.training.data import BatchSampler, Dataset, load_dataset
from asyncsync.training.models import build_model
from asyncsync.training.trainer import BatchSource, model_numel, resolve_device
from asyncsync.transport.http_client import client_tls
from asyncsync.transport.http_server import ParameterServer, server_tls
from asyncsync.transport.tokens import worker_token

WORKER_TOKEN_ENV = "ASYNCSYNC_WORKER_TOKEN"
"""A worker node's token, when it is not given the run token (see `run_worker_token`)."""


def run_data(spec: RunSpec) -> Dataset:
    """The run's dataset (the same in every process: synthetic data comes from the seed)."""
    return load_dataset(spec.data.name, spec.seed, spec.data.root, spec.data.download)


def dataset_loader() -> Callable[[RunSpec], Dataset]:
    """`run_data`, each distinct dataset loaded once (the checks and `check`'s tables share
    it: a population study's five runs loaded the same synthetic set ten times)."""
    loaded: dict[tuple[str, int | None, str, bool], Dataset] = {}

    def load(spec: RunSpec) -> Dataset:
        seed = spec.seed if spec.data.name == "synthetic" else None  # made from the seed
        key = (spec.data.name, seed, str(spec.data.root), spec.data.download)
        if key not in loaded:
            loaded[key] = run_data(spec)
        return loaded[key]

    return load


def run_model(spec: RunSpec, data: Dataset) -> torch.nn.Module:
    """The run's model, initialised from the run's seed on the CPU generator (the model is
    built on the CPU).

    Not `torch.manual_seed`: it also queues a seeding of each device backend not yet
    initialised (CUDA on a CPU host, XPU, MTIA), recording a stack trace each time, in
    queues that only grow: 1.8 ms a call on 2 cores, and a virtual run builds one model a
    worker (1.8 s of a 1,000-worker run's set-up).
    """
    torch.default_generator.manual_seed(spec.seed)
    try:
        return build_model(spec.model.name, data.input_shape, data.num_classes,
                           spec.model.options)
    except ValueError as exc:  # not importable, or options it does not take: the recipe's
        raise ConfigError(f"{spec.name}: model: {exc}") from None


def build_server(spec: RunSpec, run_id: str, log_dir: Path | None, host: str = "127.0.0.1",
                 port: int = 0) -> ParameterServer:
    """The parameter server of one run, as the CLI's ``server`` command starts it."""
    data = run_data(spec)
    events = JsonlLog(log_dir / "events.jsonl" if log_dir else None)
    return ParameterServer(
        run_model(spec, data), get_protocol(spec.protocol.name), spec.workers,
        server_settings(spec, run_id, log_dir), host=host, port=port,
        token=spec.resolved_token(), protocol_params=spec.protocol.params,
        test_data=(data.test_x, data.test_y), events=events, tls=run_server_tls(spec))


def run_server_tls(spec: RunSpec) -> ssl.SSLContext | None:
    """The server's TLS context from ``tls.cert`` and ``tls.key`` (None: plain http)."""
    if not spec.tls.cert:
        return None
    try:
        return server_tls(spec.tls.cert, spec.tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls.cert/tls.key: cannot load {spec.tls.cert} with "
                          f"{spec.tls.key}: {exc}") from exc


def run_client_tls(spec: RunSpec) -> ssl.SSLContext | None:
    """The context that verifies the server against ``tls.ca`` (None: the system's store)."""
    if not spec.tls.ca:
        return None
    try:
        return client_tls(spec.tls.ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls.ca: cannot load {spec.tls.ca}: {exc}") from exc


def run_worker_token(spec: RunSpec) -> str | None:
    """A worker's bearer token: ASYNCSYNC_WORKER_TOKEN if set, else the worker token derived
    from the run token (ASYNCSYNC_TOKEN or the recipe's), else None (no authentication)."""
    run_token = spec.resolved_token()
    return os.environ.get(WORKER_TOKEN_ENV) or (worker_token(run_token) if run_token
                                                else None)


def server_settings(spec: RunSpec, run_id: str, log_dir: Path | None) -> ServerSettings:
    """The server settings a run's recipe gives. On the virtual clock no worker is dropped
    for silence: its workers send no heartbeats (`asyncsync.study.simulation`)."""
    return ServerSettings(
        run_id=run_id, lr=spec.optim.lr, momentum=spec.optim.momentum,
        weight_decay=spec.optim.weight_decay, eval_interval_s=spec.eval.interval_s,
        eval_device=str(resolve_device(spec.device)), eval_samples=spec.eval.samples,
        eval_batch=spec.eval.batch_size,
        time_s=spec.stop.time_s, target_accuracy=spec.stop.target_accuracy,
        stop_at_target=spec.stop.stop_at_target, patience_s=spec.stop.patience_s,
        worker_timeout_s=spec.fault.worker_timeout_s if spec.clock == "real" else None,
        checkpoint_path=checkpoint_file(log_dir) if spec.fault.checkpoint_s and log_dir
        else None, checkpoint_s=spec.fault.checkpoint_s or 10.0,
        max_batch=largest_batch(spec))


def largest_batch(spec: RunSpec) -> int:
    """The most samples one step of `spec`'s run may claim: all the workers' batches, or
    more where the protocol assigns batch sizes (LB-BSP's optional ``largest_batch`` hook
    on its params, as ``check_workers`` is)."""
    default = spec.data.batch_size * spec.workers
    largest = getattr(spec.protocol.params, "largest_batch", None)
    if not callable(largest):
        return default
    return max(default, int(largest(spec.workers, spec.data.batch_size)))


def batch_sources(spec: RunSpec, data: Dataset) -> Callable[[int], BatchSource]:
    """Each worker's batches, by rank: its partition of the training set, seeded per rank
    (the partition is drawn once)."""
    shards = run_shards(spec, data)
    return lambda rank: BatchSampler(data, shards[rank], seed=spec.seed * 1000 + rank)


def run_shards(spec: RunSpec, data: Dataset) -> list[torch.Tensor]:
    """Each worker's sample indices (the recipe's partition, drawn with the run's seed).

    Raises:
        ConfigError: the partition leaves a worker without a sample.
    """
    shards = partition(data.train_y, spec.workers, spec.data.partition, spec.seed,
                       spec.data.alpha, spec.data.classes_per_worker, spec.data.sigma)
    empty = [rank for rank, shard in enumerate(shards) if len(shard) == 0]
    if empty:
        listed = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
        raise ConfigError(f"run {spec.name}: data.partition: {spec.data.partition} leaves "
                          f"{len(empty)} of {spec.workers} workers without a training sample "
                          f"(the split has {len(data.train_y)}; ranks {listed}): use fewer "
                          "workers or another partition")
    return shards


def checkpoint_file(log_dir: Path) -> Path:
    """Where a run's server keeps its checkpoint."""
    return log_dir / "checkpoint.npz"


def link_seed(seed: int, rank: int) -> int:
    """The seed of worker `rank`'s link jitter in a run seeded `seed` (both clocks)."""
    return seed * 1000 + rank


def worker_link(spec: RunSpec, rank: int) -> Link | None:
    """Worker `rank`'s emulated link (None: not shaped, or shaped by the kernel); a
    capacity trace's bandwidths replace the network section's."""
    if spec.network.emulation == "kernel":
        return None
    link_spec = spec.network.link(rank)
    rows = spec.population().capacity
    if rows is not None:
        link_spec = dataclasses.replace(link_spec, uplink_mbps=rows[rank].up_mbps,
                                        downlink_mbps=rows[rank].down_mbps)
    return Link(link_spec, seed=link_seed(spec.seed, rank)) if link_spec.shaped else None


@dataclass(frozen=True)
class StepTimes:
    """How a run's local steps are charged before slowness: where the time comes from
    (``device``, ``explicit`` or ``calibrated``) and each worker's cost and facts (device,
    FLOPs and seconds per step of the recipe's batch) for summary.json and `check`."""

    source: str
    costs: list[StepCost]
    workers: list[dict[str, Any]]

    def facts(self) -> dict[str, Any]:
        """What summary.json records of them."""
        return {"step_time_source": self.source, "step_time": self.workers}


def step_times(spec: RunSpec, flops: ModelFlops | None = None,
               calibrated_s: float | None = None) -> StepTimes:
    """Each worker's step cost: the recipe's explicit ``base_step_s``, a calibrated one, or
    the step's FLOPs (`run_flops`) over the worker's device rate."""
    batch = spec.data.batch_size
    rows = spec.population().capacity
    if rows is not None:
        return _capacity_step_times(rows, batch, flops)
    fixed = spec.compute.explicit_step_s or calibrated_s
    if fixed:
        source = "explicit" if spec.compute.explicit_step_s else "calibrated (host-dependent)"
        fixed_cost = FixedStepCost(fixed, batch)
        return StepTimes(source, [fixed_cost] * spec.workers,
                         [{"rank": rank, "step_s": fixed} for rank in range(spec.workers)])
    if flops is None:
        raise ValueError("a device-charged run needs its model's FLOPs")
    costs: list[StepCost] = []
    facts = []
    for rank in range(spec.workers):
        name, rate, op_s = spec.compute.throughput(rank)
        cost = DeviceStepCost(flops, rate, batch, op_s)
        costs.append(cost)
        facts.append({"rank": rank, "device": name, "flops_per_s": rate,
                      "flops_per_step": flops.flops(batch), "ops_per_step": flops.ops,
                      "op_overhead_s": op_s, "step_s": cost.base_s(batch)})
    return StepTimes("device", costs, facts)


def _capacity_step_times(rows: list[Capacity], batch: int, flops: ModelFlops | None
                         ) -> StepTimes:
    """Each worker's step cost from its capacity row: seconds per sample x the batch, or
    the step's FLOPs over the row's FLOP/s."""
    costs: list[StepCost] = []
    facts = []
    for rank, row in enumerate(rows):
        if row.s_per_sample is not None:
            cost: StepCost = FixedStepCost(row.s_per_sample * batch, batch)
        elif flops is None:
            raise ValueError("a capacity trace in FLOP/s needs the model's FLOPs")
        else:
            assert row.flops_per_s is not None
            cost = DeviceStepCost(flops, row.flops_per_s, batch)
        costs.append(cost)
        facts.append({"rank": rank, "capacity_row": row.row, "step_s": cost.base_s(batch)})
    return StepTimes("capacity", costs, facts)


def run_flops(spec: RunSpec, model: torch.nn.Module, input_shape: tuple[int, ...]
              ) -> ModelFlops:
    """The FLOPs of one local step of the run's model (the timing model: as declared)."""
    per_param = optimizer_flops_per_param(spec.optim.momentum, spec.optim.weight_decay, False)
    if spec.model.name == TIMING_MODEL:
        params = spec.model.size_mb * 1e6 / 4
        return ModelFlops(spec.compute.flops_per_sample, per_param * params)
    return count_step_flops(model, input_shape, spec.data.batch_size, per_param)


TransportFor = Callable[[Link | None], Transport]
"""Makes a worker's transport from its link."""
SeamFor = Callable[[ComputeProfile], WorkerSeam]
"""Makes a worker's compute seam from its profile."""


def assemble_worker(spec: RunSpec, rank: int, run_id: str, model: torch.nn.Module,
                    batches: BatchSource, transport: TransportFor, seam: SeamFor,
                    log_dir: Path | None, device: str) -> Worker:
    """Worker `rank` of a run on either clock: its compute profile, its link (one seed
    rule), its seam and its transport, the last two made by the clock's factories; on the
    real clock it sends the recipe's heartbeats, on the virtual clock none (a worker in the
    server's process cannot fall silent: `asyncsync.study.simulation`)."""
    return Worker(
        rank, transport(worker_link(spec, rank)), model, batches,
        get_protocol(spec.protocol.name), protocol_params=spec.protocol.params, run_id=run_id,
        lr=spec.optim.lr, momentum=spec.optim.momentum, weight_decay=spec.optim.weight_decay,
        batch_size=spec.data.batch_size, device=device,
        heartbeat_s=spec.fault.heartbeat_s if spec.clock == "real" else None,
        compressor=spec.network.compressor(), seam=seam(spec.compute_profile(rank)),
        availability=spec.population().online(rank),
        log_path=log_dir / f"worker-{rank}.jsonl" if log_dir else None)


def build_worker(spec: RunSpec, rank: int, url: str, run_id: str,
                 log_dir: Path | None, local_addr: str | None = None) -> Worker:
    """Worker `rank` of one run on the real clock, as the CLI's ``worker`` command starts
    it (paced when the recipe sets ``compute.base_step_s``; ``compute.device`` charges
    virtual time only: a real run is timed by its host)."""
    if not 0 <= rank < spec.workers:
        raise ValueError(f"rank {rank} is outside 0..{spec.workers - 1}")
    tls = run_client_tls(spec)
    if tls is not None and not url.startswith("https://"):
        raise ConfigError(f"tls.ca is set, so the server's URL must be https://, got {url}")
    data = run_data(spec)
    model = run_model(spec, data)
    token = run_worker_token(spec)
    cost = None
    rows = spec.population().capacity
    if spec.compute.explicit_step_s or (rows and rows[rank].s_per_sample is not None):
        # paced; a device or a capacity in FLOP/s charges virtual time only
        cost = step_times(spec).costs[rank]

    def dial(link: Link | None) -> Transport:
        return connect(url, Dial(model_numel(model), link, local_addr, token, tls,
                                 spec.network.channel))

    def threaded(profile: ComputeProfile) -> WorkerSeam:
        return ThreadedWorkerSeam(profile, f"asyncsync-compute-{rank}", cost)

    return assemble_worker(spec, rank, run_id, model, batch_sources(spec, data)(rank), dial,
                           threaded, log_dir, spec.device)
