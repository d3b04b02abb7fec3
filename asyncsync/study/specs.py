"""The specs of one run: what a recipe's ``defaults`` and ``[[runs]]`` entries resolve to.

Each section of a run's table (``stop``, ``model``, ``data``, ``optim``, ``eval``,
``fault``, ``tls``, the protocol, and the heterogeneity sections of
`asyncsync.study.hetero_specs`) is one frozen dataclass checked on construction; `RunSpec`
holds them and checks what spans sections. Below the study layer
code receives the section it uses, not the whole `RunSpec`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from asyncsync.hetero.compute import ComputeProfile, check_profile
from asyncsync.hetero.network import kernel_rate_problem
from asyncsync.hetero.partition import PARTITIONS
from asyncsync.protocols.base import get_protocol
from asyncsync.runlog.reading import unswept_name
from asyncsync.schema import option
from asyncsync.study.hetero_specs import (
    CALIBRATE,
    PER_WORKER_LINKS,
    AvailabilitySpec,
    CapacitySpec,
    ComputeSpec,
    NetworkSpec,
)
from asyncsync.study.launch import TOKEN_ENV
from asyncsync.study.population import Population, population
from asyncsync.training.catalog import DATASETS, MODELS
from asyncsync.wire.codecs import COMPRESSED_KINDS

MAX_WORKERS = 1_000_000
"""The most workers a run may have: 10x the largest run measured (100,000 virtual workers
set up in 9-11 s, docs/virtual-time.md); a mistyped count (1e20) hung the recipe's
checks, which walk every worker."""


def _positive(value: float) -> bool:
    return value > 0


@dataclass(frozen=True)
class StopSpec:
    time_s: float = option(60.0, _positive, "must be > 0", "wall-clock budget of one run")
    target_accuracy: float | None = option(
        None, lambda v: v is None or 0 < v <= 1, "must be in (0, 1]",
        "time-to-accuracy threshold")
    stop_at_target: bool = option(False, help="end the run once the target is reached")
    patience_s: float | None = option(
        None, lambda v: v is None or v > 0, "must be > 0",
        "give up once the best accuracy has not risen by 0.01 for this long (a diverged or "
        "stalled configuration of a sweep ends early)")


@dataclass(frozen=True)
class ModelSpec:
    name: str = option("cnn", lambda v: v in MODELS or ":" in v,
                       f"must be one of {', '.join(MODELS)}, or package.module:callable",
                       " | ".join((*MODELS, "package.module:callable")))
    options: dict[str, Any] = option({}, help="keyword arguments of the model builder")
    size_mb: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                            "timing model only: the model's declared size on the wire, in MB "
                            "(10^6 bytes)")


@dataclass(frozen=True)
class DataSpec:
    name: str = option("synthetic", lambda v: v in DATASETS,
                       f"must be one of {', '.join(DATASETS)}")
    root: str = option("data", help="directory of torchvision datasets")
    download: bool = option(False, help="let torchvision download missing files")
    partition: str = option("iid", lambda v: v in PARTITIONS,
                            f"must be one of {', '.join(PARTITIONS)}")
    alpha: float = option(0.5, _positive, "must be > 0", "dirichlet concentration")
    classes_per_worker: int = option(2, _positive, "must be > 0",
                                     "shards and label_quantity: classes each worker holds")
    sigma: float = option(1.0, lambda v: 0 <= v < math.inf, "must be >= 0 and finite",
                          "quantity_skew: sigma of the lognormal shard sizes (0: equal)")
    batch_size: int = option(32, _positive, "must be > 0")


@dataclass(frozen=True)
class OptimSpec:
    lr: float = option(0.05, _positive, "must be > 0")
    momentum: float = option(0.0, lambda v: 0 <= v < 1, "must be in [0, 1)")
    weight_decay: float = option(0.0, lambda v: v >= 0, "must be >= 0")


@dataclass(frozen=True)
class EvalSpec:
    interval_s: float = option(2.0, _positive, "must be > 0",
                               "seconds between evaluations of the global model")
    samples: int | None = option(
        None, lambda v: v is None or v > 0, "must be > 0",
        "evaluate on this many test samples, a random subset drawn with a fixed seed "
        "(the same samples in every run of a study; default: the whole split); the "
        "global model is evaluated on the run's device")
    batch_size: int = option(1000, _positive, "must be > 0", "samples per evaluation batch")


@dataclass(frozen=True)
class FaultSpec:
    """Failure handling: when a silent worker is dropped, heartbeats, checkpoints."""

    worker_timeout_s: float = option(30.0, _positive, "must be > 0",
                                     "drop a worker not heard from for this long (real "
                                     "clock)")
    heartbeat_s: float = option(2.0, _positive, "must be > 0",
                                "seconds between a worker's heartbeats (real clock)")
    checkpoint_s: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                                 "server checkpoint period (0 = off; real clock)")

    def __post_init__(self) -> None:
        if self.heartbeat_s >= self.worker_timeout_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below "
                             f"worker_timeout_s ({self.worker_timeout_s})")


@dataclass(frozen=True)
class TlsSpec:
    """TLS between a run's nodes (PEM files; relative paths are from the working
    directory). With `cert` and `key` the server serves https; workers verify it against
    `ca`, else against the system's trust store."""

    cert: str = option("", help="server: certificate chain, PEM (with key: serve https)")
    key: str = option("", help="server: the certificate's private key, PEM (unencrypted)")
    ca: str = option("", help="workers: CA certificate(s) to verify the server with, PEM "
                              "(default: the system's trust store)")

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("cert and key go together: give both or neither")


@dataclass(frozen=True)
class ProtocolSpec:
    name: str
    params: Any

    def as_table(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self.params)}


CLOCKS = ("real", "virtual")
TIMING_MODEL = "timing"


@dataclass(frozen=True)
class RunSpec:
    """One fully resolved run."""

    name: str = option("", lambda v: bool(v) and "/" not in v and v not in (".", ".."),
                       "must be a non-empty name without '/' (it names the run's log "
                       "directory)")
    protocol: ProtocolSpec = field(
        default_factory=lambda: ProtocolSpec("bsp", get_protocol("bsp").params()))
    workers: int = option(4, lambda v: 1 <= v <= MAX_WORKERS,
                          f"must be > 0 and at most {MAX_WORKERS}")
    seed: int = 0
    device: str = option("cpu", lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None,
                         "must be auto, cpu, cuda or cuda:i", "auto | cpu | cuda | cuda:i")
    clock: str = option("real", lambda v: v in CLOCKS, f"must be one of {', '.join(CLOCKS)}",
                        "real: processes and HTTP in real time; virtual: one process on a "
                        "virtual clock")
    sweep: dict[str, Any] = option({}, help="the swept key and value of this run "
                                            "(set by the recipe's [sweep])", internal=True)
    token: str = option("", help="shared bearer token of the run's nodes; the environment "
                                 "variable ASYNCSYNC_TOKEN takes precedence")
    stop: StopSpec = field(default_factory=StopSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    fault: FaultSpec = field(default_factory=FaultSpec)
    tls: TlsSpec = field(default_factory=TlsSpec)
    availability: AvailabilitySpec = field(default_factory=AvailabilitySpec)
    capacity: CapacitySpec = field(default_factory=CapacitySpec)

    def __post_init__(self) -> None:
        # parameters that say what fits the run: its size (the server checks it too), and
        # whether its batches tell each worker's shard size (a timing model's do not)
        for hook, fact in (("check_workers", self.workers),
                           ("check_shards", self.model.name != TIMING_MODEL)):
            check = getattr(self.protocol.params, hook, None)
            if callable(check):
                try:
                    check(fact)
                except ValueError as exc:
                    raise ValueError(f"protocol.{exc}") from None
        self._check_network()
        if self.network.message_overhead_ms and self.clock != "virtual":
            raise ValueError("network.message_overhead_ms: a real run pays its messages' "
                             "software cost itself; it is charged on the virtual clock only "
                             "(set clock = \"virtual\")")
        if self.fault.checkpoint_s and self.clock == "virtual":
            raise ValueError("fault.checkpoint_s: a virtual run takes no checkpoints (it is "
                             "deterministic: a cut one is run again from its start); set "
                             "clock = \"real\" or leave this key out")
        if self.stop.stop_at_target and self.stop.target_accuracy is None:
            raise ValueError("stop.stop_at_target: there is no target to stop at; set "
                             "stop.target_accuracy too")
        if self.stop.patience_s is not None and self.stop.patience_s < self.eval.interval_s:
            raise ValueError(f"stop.patience_s: {self.stop.patience_s:g} s is shorter than "
                             f"eval.interval_s ({self.eval.interval_s:g} s); patience is "
                             "judged at evaluations")
        self._check_compute()
        self._check_capacity()
        self.population()  # a malformed trace is refused with the recipe
        if self.model.name == TIMING_MODEL:
            self._check_timing()
        elif self.model.size_mb:
            raise ValueError("model.size_mb: only the timing model declares its size "
                             f"(model.name = \"{TIMING_MODEL}\")")
        if self.compute.flops_per_sample and self.model.name != TIMING_MODEL:
            raise ValueError("compute.flops_per_sample: only the timing model declares its "
                             f"FLOPs (model.name = \"{TIMING_MODEL}\"); a real model's are "
                             "counted")

    def _check_network(self) -> None:
        """Who shapes the links on this clock, and what each way can shape."""
        network, kernel = self.network, self.network.emulation == "kernel"
        if kernel and self.clock != "real":
            raise ValueError("network.emulation: \"kernel\" shapes a real run's sockets "
                             "(set clock = \"real\")")
        problem = kernel_rate_problem(network, self.workers) if kernel else None
        if problem:
            raise ValueError(problem)
        if network.server_mbps and self.clock != "virtual" and not kernel:
            raise ValueError("network.server_mbps: the server's shared link is modelled on "
                             "the virtual clock and shaped by the kernel (set clock = "
                             "\"virtual\" or network.emulation = \"kernel\")")
        kinds = get_protocol(self.protocol.name).server.push_kinds
        if network.compression != "none" and not kinds & COMPRESSED_KINDS:
            raise ValueError(f"network.compression: {self.protocol.name} pushes only "
                             f"{', '.join(sorted(kinds))}, which travel as float32 (only "
                             f"{' and '.join(sorted(COMPRESSED_KINDS))} pushes are compressed)")
        lossy = [rank for rank in range(self.workers) if network.link(rank).loss_pct]
        if lossy and self.clock == "real" and not kernel:
            raise ValueError("network.loss_pct: app pacing cannot drop packets (set "
                             "network.emulation = \"kernel\", or clock = \"virtual\")")
        if self.clock == "virtual" and any(network.link(r).round_trip_s == 0 for r in lossy):
            raise ValueError("network.loss_pct: on the virtual clock loss limits TCP's rate "
                             "through the round trip, so it needs network.latency_ms > 0")

    def _check_compute(self) -> None:
        """Per-worker lists fit the workers (device lists exactly; slowdowns and links may
        be shorter, the rest 1x and 0, never longer: an entry past the last worker would
        be dropped unseen); calibration and batching are virtual-clock tools."""
        for key in ("device", "flops_per_s"):
            value = getattr(self.compute, key)
            if isinstance(value, list) and len(value) != self.workers:
                raise ValueError(f"compute.{key}: {len(value)} entries for {self.workers} "
                                 "workers (give one value, or one per worker)")
        lists = {"compute.slowdown": self.compute.slowdown,
                 **{f"network.{key}": getattr(self.network, key) for key in PER_WORKER_LINKS}}
        for key, value in lists.items():
            if isinstance(value, list) and len(value) > self.workers:
                raise ValueError(f"{key}: {len(value)} entries for {self.workers} workers: "
                                 f"entries past worker {self.workers - 1} would be ignored "
                                 "(give at most one per worker; missing ones are "
                                 f"{'1' if key == 'compute.slowdown' else '0'})")
        compute = self.compute
        rates = compute.flops_per_s if isinstance(compute.flops_per_s, list) \
            else [compute.flops_per_s]
        if compute.efficiency and (compute.base_step_s or self.capacity.trace
                                   or all(rate > 0 for rate in rates)):
            raise ValueError("compute.efficiency: it scales a named device's peak, and no "
                             "worker is charged by a device here (base_step_s, flops_per_s "
                             "or capacity.trace sets every step's cost); leave it out")
        try:
            check_profile(compute.profile, self.workers)
        except ValueError as exc:
            raise ValueError(f"compute.{exc}") from None
        if self.compute.calibrate and self.clock != "virtual":
            raise ValueError(f"compute.base_step_s: \"{CALIBRATE}\" sets a virtual run's step "
                             "time; a real run times itself (set clock = \"virtual\")")
        if self.compute.batched != "auto" and self.clock != "virtual":
            raise ValueError("compute.batched: a real run's workers compute in processes of "
                             "their own; batching them is for the virtual clock (set clock = "
                             "\"virtual\")")

    def _check_capacity(self) -> None:
        """A capacity trace sets speeds and bandwidths: no other source may too."""
        if not self.capacity.trace:
            return
        net, compute = self.network, self.compute
        for key, value in (("compute.base_step_s", compute.base_step_s),
                           ("compute.flops_per_s", compute.flops_per_s),
                           ("compute.device", compute.device),
                           ("network.bandwidth_mbps", net.bandwidth_mbps),
                           ("network.uplink_mbps", net.uplink_mbps),
                           ("network.downlink_mbps", net.downlink_mbps)):
            if value:
                raise ValueError(f"{key}: capacity.trace sets each worker's speed and "
                                 "bandwidth; leave this key out")

    def population(self) -> Population:
        """The run's availability and capacity, per worker (read once per process)."""
        return population(dataclasses.asdict(self.availability), self.capacity.trace,
                          self.workers, self.seed, self.stop.time_s)

    def _check_timing(self) -> None:
        """Timing-only runs are virtual, declare their size and step time, and have no
        accuracy to reach."""
        if self.clock != "virtual":
            raise ValueError("model.name: the timing model runs on the virtual clock only "
                             "(set clock = \"virtual\")")
        if not self.model.size_mb:
            raise ValueError("model.size_mb: the timing model needs its declared size (> 0)")
        if not (self.compute.explicit_step_s or self.compute.flops_per_sample):
            raise ValueError("compute.base_step_s: the timing model needs the step time it "
                             "stands for (> 0), or compute.flops_per_sample for a device to "
                             "charge; there is no real model to count or calibrate")
        if self.stop.target_accuracy is not None:
            raise ValueError("stop.target_accuracy: a timing run has no accuracy to reach "
                             "(it is not evaluated)")

    def compute_profile(self, rank: int) -> ComputeProfile:
        return self.compute.build(rank, self.workers, self.seed)

    @property
    def base_name(self) -> str:
        """The run's name in the recipe (without its sweep point, also as asyncsync wrote it
        before 2026-11-27)."""
        return unswept_name(self.name, self.sweep)

    def as_table(self) -> dict[str, Any]:
        """The resolved run as plain data, the token left out (it never goes to logs)."""
        table = dataclasses.asdict(self)
        table["protocol"] = self.protocol.as_table()
        table["token"] = ""
        return table

    def resolved_token(self) -> str | None:
        """ASYNCSYNC_TOKEN if set, else the recipe's token, else None (no auth)."""
        return os.environ.get(TOKEN_ENV) or self.token or None
