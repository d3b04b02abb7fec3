"""Recipes: TOML files composing protocol x model x data x heterogeneity into runs.

Shape (the README's "Running recipes" section lists every key)::

    name = "quickstart"      # optional; defaults to the file's stem
    baseline = "bsp"         # run that speedups are measured against (default: first run)
    [defaults]               # every key of a run; each [[runs]] entry may override any
    [[runs]]
    name = "bsp"
    protocol = "bsp"         # or { name = "ssp", staleness = 3 }

Each run's table is ``defaults`` deep-merged with the run's own keys, then checked against
`RunSpec`: unknown keys and ill-typed or out-of-range values raise `ConfigError` naming the
key, e.g. ``runs[1] (asp).stop.time_s: must be > 0, got -1``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncsync.compression import CODECS, Compressor
from asyncsync.data import DATASETS
from asyncsync.engine.channel import CHANNELS
from asyncsync.hetero.compute import PROFILES, ComputeProfile, build_profile, profile_params
from asyncsync.hetero.cost_model import DEFAULT_DEVICE, DEVICES, device
from asyncsync.hetero.network import LinkSpec
from asyncsync.hetero.partition import PARTITIONS
from asyncsync.protocols.base import NoParams, get_protocol
from asyncsync.runlogs import sweep_suffix
from asyncsync.schema import ConfigError, from_mapping, option

TOKEN_ENV = "ASYNCSYNC_TOKEN"
TOPK_FRACTION = 0.01


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
    name: str = option("cnn", help="mlp | cnn | resnet18 | timing | package.module:callable")
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
    classes_per_worker: int = option(2, _positive, "must be > 0", "shards partition")
    batch_size: int = option(32, _positive, "must be > 0")


@dataclass(frozen=True)
class OptimSpec:
    lr: float = option(0.05, _positive, "must be > 0")
    momentum: float = option(0.0, lambda v: 0 <= v < 1, "must be in [0, 1)")
    weight_decay: float = option(0.0, lambda v: v >= 0, "must be >= 0")


PerWorker = float | list[float]


def _non_negative(value: PerWorker | None) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(v is None or v >= 0 for v in values)


def _pick(value: PerWorker, rank: int) -> float:
    if isinstance(value, list):
        return value[rank] if rank < len(value) else 0.0
    return value


CALIBRATE = "calibrate"
"""``compute.base_step_s = "calibrate"``: measure the step time on this host (host-dependent)."""


def _step_time(value: float | str) -> bool:
    return value == CALIBRATE if isinstance(value, str) else value >= 0


def _devices(value: str | list[str]) -> bool:
    names = value if isinstance(value, list) else [value] if value else []
    return all(name in DEVICES for name in names)


@dataclass(frozen=True)
class ComputeSpec:
    """What a step costs (a device's FLOP rate, or an explicit or calibrated time) and the
    slowness on top of it: static factors and an optional time-varying profile."""

    slowdown: list[float] = option([], lambda v: all(f >= 1 for f in v),
                                   "factors must be >= 1",
                                   "one factor per worker; missing ones are 1")
    profile: dict[str, Any] = option({}, help=f"{{ name = {' | '.join(PROFILES)}, ... }}")
    device: str | list[str] = option("", _devices, f"must name devices of {', '.join(DEVICES)}",
                                     "the hardware a step is charged as: one name, or one per "
                                     f"worker (virtual default: {DEFAULT_DEVICE}); "
                                     "`asyncsync devices` lists them")
    flops_per_s: PerWorker = option(0.0, _non_negative, "must be >= 0",
                                    "sustained FLOP/s instead of a device: one value, or one "
                                    "per worker (0 = the device's)")
    efficiency: float = option(0.0, lambda v: 0 <= v <= 1, "must be in [0, 1]",
                               "the share of a named device's peak a step reaches "
                               "(0 = the device's own)")
    flops_per_sample: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                                     "timing model: FLOPs of one sample's forward and backward")
    base_step_s: float | str = option(0.0, _step_time, f"must be >= 0 or \"{CALIBRATE}\"",
                                      "seconds per step of the recipe's batch, instead of the "
                                      f"device (0 = off; \"{CALIBRATE}\": measured on this "
                                      "host, host-dependent)")

    def __post_init__(self) -> None:
        if self.profile:
            profile_params(self.profile)

    def build(self, rank: int, workers: int, seed: int) -> ComputeProfile:
        factor = self.slowdown[rank] if rank < len(self.slowdown) else 1.0
        return build_profile(self.profile, factor, rank, workers, seed)

    @property
    def explicit_step_s(self) -> float:
        """The recipe's own ``base_step_s`` (0: none; calibration is not explicit)."""
        return 0.0 if isinstance(self.base_step_s, str) else self.base_step_s

    @property
    def calibrate(self) -> bool:
        """Whether the step time is to be measured on this host."""
        return self.base_step_s == CALIBRATE

    def throughput(self, rank: int) -> tuple[str, float, float]:
        """Worker `rank`'s device label, sustained FLOP/s and seconds per operation
        (`flops_per_s` first, with no per-operation cost; else the named device, else
        `DEFAULT_DEVICE`)."""
        rate = _pick(self.flops_per_s, rank)
        if rate > 0:
            return "flops_per_s", rate, 0.0
        names = self.device if isinstance(self.device, list) else [self.device or
                                                                    DEFAULT_DEVICE]
        named = device(names[rank] if rank < len(names) else DEFAULT_DEVICE)
        return (named.name, named.peak_flops_per_s * (self.efficiency or named.efficiency),
                named.op_overhead_s)


@dataclass(frozen=True)
class NetworkSpec:
    """Each key is one value for all workers or a list with one per worker (missing: 0)."""

    bandwidth_mbps: PerWorker = option(0.0, _non_negative, "must be >= 0",
                                       "both directions, Mbit/s (0 = unlimited)")
    uplink_mbps: PerWorker | None = option(None, _non_negative, "must be >= 0",
                                           "overrides bandwidth_mbps for pushes")
    downlink_mbps: PerWorker | None = option(None, _non_negative, "must be >= 0",
                                             "overrides bandwidth_mbps for pulls")
    latency_ms: PerWorker = option(0.0, _non_negative, "must be >= 0",
                                   "one-way delay, paid in each direction of a request")
    jitter_ms: PerWorker = option(0.0, _non_negative, "must be >= 0",
                                  "uniform extra delay in [0, jitter] per direction")
    server_mbps: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                                "the server's own link, shared by all workers, each way "
                                "(0 = unlimited; virtual clock only)")
    message_overhead_ms: float = option(0.0, lambda v: 0 <= v < math.inf,
                                        "must be >= 0 and finite",
                                        "software cost of a message (HTTP, framing, checks) "
                                        "charged each way (virtual clock only)")
    compression: str = option("none", lambda v: v in CODECS,
                              f"must be one of {', '.join(CODECS)}",
                              "codec of gradient and delta pushes (model pushes and pulls "
                              "stay float32)")
    topk_fraction: float = option(TOPK_FRACTION, lambda v: 0 < v <= 0.5, "must be in (0, 0.5]",
                                  "compression = \"topk\": the share of entries pushed")
    error_feedback: bool = option(True, help="lossy compression: carry what a push left out "
                                             "into the next push of its kind")
    channel: str = option("stream", lambda v: v in CHANNELS,
                          f"must be one of {', '.join(CHANNELS)}",
                          "real clock: workers' requests as frames on an upgraded connection "
                          "(stream) or as one HTTP POST each (http)")

    def __post_init__(self) -> None:
        if self.topk_fraction != TOPK_FRACTION and self.compression != "topk":
            raise ValueError(f"topk_fraction is only used with compression = \"topk\" "
                             f"(compression is {self.compression!r})")

    def compressor(self) -> Compressor | None:
        """A fresh codec state for one worker (None: pushes go as float32)."""
        if self.compression == "none":
            return None
        return Compressor(self.compression, self.topk_fraction, self.error_feedback)

    def link(self, rank: int) -> LinkSpec:
        up = self.bandwidth_mbps if self.uplink_mbps is None else self.uplink_mbps
        down = self.bandwidth_mbps if self.downlink_mbps is None else self.downlink_mbps
        return LinkSpec(_pick(up, rank), _pick(down, rank), _pick(self.latency_ms, rank),
                        _pick(self.jitter_ms, rank))


@dataclass(frozen=True)
class EvalSpec:
    interval_s: float = option(2.0, _positive, "must be > 0",
                               "seconds between evaluations of the global model")


@dataclass(frozen=True)
class FaultSpec:
    """Failure handling: when a silent worker is dropped, heartbeats, checkpoints."""

    worker_timeout_s: float = option(30.0, _positive, "must be > 0",
                                     "drop a worker not heard from for this long")
    heartbeat_s: float = option(2.0, _positive, "must be > 0",
                                "seconds between a worker's heartbeats")
    checkpoint_s: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                                 "server checkpoint period (0 = off)")

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
    protocol: ProtocolSpec = field(default_factory=lambda: ProtocolSpec("bsp", NoParams()))
    workers: int = option(4, _positive, "must be > 0")
    seed: int = 0
    device: str = option("cpu", help="auto | cpu | cuda | cuda:i")
    clock: str = option("real", lambda v: v in CLOCKS, f"must be one of {', '.join(CLOCKS)}",
                        "real: processes and HTTP in real time; virtual: one process on a "
                        "virtual clock")
    sweep: dict[str, Any] = option({}, help="the swept key and value of this run "
                                            "(set by the recipe's [sweep])")
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

    def __post_init__(self) -> None:
        if self.network.server_mbps and self.clock != "virtual":
            raise ValueError("network.server_mbps: the server's shared link is modelled on "
                             "the virtual clock only (set clock = \"virtual\")")
        if self.network.message_overhead_ms and self.clock != "virtual":
            raise ValueError("network.message_overhead_ms: a real run pays its messages' "
                             "software cost itself; it is charged on the virtual clock only "
                             "(set clock = \"virtual\")")
        if self.stop.patience_s is not None and self.stop.patience_s < self.eval.interval_s:
            raise ValueError(f"stop.patience_s: {self.stop.patience_s:g} s is shorter than "
                             f"eval.interval_s ({self.eval.interval_s:g} s); patience is "
                             "judged at evaluations")
        self._check_compute()
        if self.model.name == TIMING_MODEL:
            self._check_timing()
        elif self.model.size_mb:
            raise ValueError("model.size_mb: only the timing model declares its size "
                             f"(model.name = \"{TIMING_MODEL}\")")

    def _check_compute(self) -> None:
        """Per-worker device lists fit the workers; calibration is a virtual-clock tool."""
        for key in ("device", "flops_per_s"):
            value = getattr(self.compute, key)
            if isinstance(value, list) and len(value) != self.workers:
                raise ValueError(f"compute.{key}: {len(value)} entries for {self.workers} "
                                 "workers (give one value, or one per worker)")
        if self.compute.calibrate and self.clock != "virtual":
            raise ValueError(f"compute.base_step_s: \"{CALIBRATE}\" sets a virtual run's step "
                             "time; a real run times itself (set clock = \"virtual\")")

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
        """The run's name in the recipe (without its sweep point)."""
        return self.name.removesuffix(sweep_suffix(self.sweep))

    def as_table(self) -> dict[str, Any]:
        """The resolved run as plain data, the token left out (it never goes to logs)."""
        table = dataclasses.asdict(self)
        table["protocol"] = self.protocol.as_table()
        table["token"] = ""
        return table

    def resolved_token(self) -> str | None:
        """ASYNCSYNC_TOKEN if set, else the recipe's token, else None (no auth)."""
        return os.environ.get(TOKEN_ENV) or self.token or None


@dataclass(frozen=True)
class Recipe:
    """A resolved recipe: its runs, the baseline, and how often each run is repeated (with
    seeds seed, seed + 1, ...)."""

    name: str
    baseline: str
    runs: list[RunSpec]
    repeats: int = 1
    tracking: dict[str, str] = field(default_factory=dict)
    """``[tracking]``: tool (tensorboard, mlflow, wandb) -> where, as ``--track`` takes it."""

    def run(self, name: str) -> RunSpec:
        for spec in self.runs:
            if spec.name == name:
                return spec
        raise ConfigError(f"no run named {name!r}; runs: {', '.join(r.name for r in self.runs)}")

    def as_table(self) -> dict[str, Any]:
        return {"name": self.name, "baseline": self.baseline, "repeats": self.repeats,
                **({"tracking": self.tracking} if self.tracking else {}),
                "runs": [r.as_table() for r in self.runs]}

    @property
    def track_specs(self) -> list[str]:
        """``[tracking]`` as ``--track`` specs (``tool=where``)."""
        return [f"{tool}={where}" if where else tool for tool, where in self.tracking.items()]

    def repeated(self, spec: RunSpec) -> list[RunSpec]:
        """`spec` once per repeat, with seeds ``seed .. seed + repeats - 1``."""
        return [dataclasses.replace(spec, seed=spec.seed + k) for k in range(self.repeats)]


TOP_KEYS = ("name", "baseline", "repeats", "repeat", "sweep", "defaults", "runs", "tracking")
TRACKERS = ("tensorboard", "mlflow", "wandb")
"""``repeat`` is written by the runner into a run's own recipe.json (which repeat it is)."""


def load_recipe(path: str | Path, overrides: Sequence[str] = (),
                only: Sequence[str] = (), repeats: int | None = None) -> Recipe:
    """Read a recipe (``.toml``, or the ``.json`` a run writes) and resolve every run.

    Args:
        path: the recipe file.
        overrides: ``KEY=VALUE`` strings setting ``defaults.KEY`` (TOML value syntax; a
            bare word is taken as a string).
        only: run names to keep (all when empty).
        repeats: overrides the recipe's ``repeats``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.')}: {exc}") from exc
    if repeats is not None:
        raw = {**raw, "repeats": repeats}
    return resolve(raw, path.stem, overrides, only)


def resolve(raw: dict[str, Any], default_name: str, overrides: Sequence[str] = (),
            only: Sequence[str] = ()) -> Recipe:
    """Resolve a parsed recipe table (see `load_recipe`)."""
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{key}: unknown top-level key (known: {', '.join(TOP_KEYS)})")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError("defaults: expected a table")
    defaults = copy.deepcopy(defaults)
    for item in overrides:
        _apply_override(defaults, item)
    runs_raw = raw.get("runs")
    if not isinstance(runs_raw, list) or not runs_raw:
        raise ConfigError("runs: a recipe needs at least one [[runs]] table")
    runs = []
    for point in _sweep_points(raw.get("sweep", {})):
        table = copy.deepcopy(defaults)
        for key, value in point.items():
            _set_default(table, key, value, "sweep")
        for index, run in enumerate(runs_raw):
            spec = _resolve_run(table, run, index)
            runs.append(dataclasses.replace(spec, name=spec.name + sweep_suffix(point),
                                            sweep=point) if point else spec)
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"runs: duplicate run names {duplicates}")
    names = list(dict.fromkeys(r.base_name for r in runs))
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: expected a non-empty string, got {name!r}")
    baseline = raw.get("baseline", names[0])
    if baseline not in names:
        raise ConfigError(f"baseline: {baseline!r} is not a run (runs: {', '.join(names)})")
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ConfigError(f"--only: no run named {unknown[0]!r} (runs: {', '.join(names)})")
        runs = [r for r in runs if r.base_name in only]
    repeats = raw.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats: must be an integer >= 1, got {repeats!r}")
    return Recipe(name, baseline, runs, repeats, _tracking(raw.get("tracking", {})))


def _tracking(table: Any) -> dict[str, str]:
    """``[tracking]``: each key a tool of `TRACKERS`, each value where it writes ("" for
    the tool's default)."""
    if not isinstance(table, dict):
        raise ConfigError("tracking: expected a table such as { tensorboard = \"tb\" }")
    for tool, where in table.items():
        if tool not in TRACKERS:
            raise ConfigError(f"tracking.{tool}: unknown tool (known: {', '.join(TRACKERS)})")
        if not isinstance(where, str):
            raise ConfigError(f"tracking.{tool}: expected a string (a folder, URI or "
                              f"project), got {where!r}")
    return dict(table)


def _apply_override(defaults: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    _set_default(defaults, key.strip(), value, "--set")


def _set_default(defaults: dict[str, Any], key: str, value: Any, origin: str) -> None:
    """``defaults.KEY = value`` for a dotted `key` (tables made on the way)."""
    parts = key.split(".")
    table = defaults
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{origin} {key}: defaults.{part} is not a table")
    table[parts[-1]] = value


def _sweep_points(sweep: Any) -> list[dict[str, Any]]:
    """The points of a ``[sweep]`` table: one key (a dotted defaults key) and its values;
    no sweep is one point without overrides."""
    if not isinstance(sweep, dict) or len(sweep) > 1:
        raise ConfigError("sweep: expected a table with one key, e.g. workers = [4, 16, 64]")
    if not sweep:
        return [{}]
    key, values = next(iter(sweep.items()))
    if not isinstance(values, list) or not values:
        raise ConfigError(f"sweep.{key}: expected a non-empty list of values")
    return [{key: value} for value in values]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` into `base`; a table with a ``name`` (a protocol, a compute
    profile) replaces the default one whole instead of mixing keys with it."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "name" not in value:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _has_key(table: dict[str, Any], dotted: str) -> bool:
    node: Any = table
    for part in dotted.split("[")[0].split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _resolve_run(defaults: dict[str, Any], run: Any, index: int) -> RunSpec:
    if not isinstance(run, dict):
        raise ConfigError(f"runs[{index}]: expected a table")
    label = f"runs[{index}]" + (f" ({run['name']})" if isinstance(run.get("name"), str) else "")

    def where(key: str) -> str:
        return f"{label}.{key}" if _has_key(run, key) or not key else f"defaults.{key}"

    merged = _merge(defaults, run)
    if "name" not in merged:
        raise ConfigError(f"{label}.name: every run needs a name")
    if "protocol" not in merged:
        raise ConfigError(f"{label}.protocol: every run needs a protocol")
    protocol = _resolve_protocol(merged.pop("protocol", None), where)
    return dataclasses.replace(from_mapping(RunSpec, merged, "", where), protocol=protocol)


def _resolve_protocol(value: Any, where: Callable[[str], str]) -> ProtocolSpec:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ConfigError(f"{where('protocol')}: expected a name or a table with 'name'")
    params = dict(value)
    name = params.pop("name")
    try:
        protocol = get_protocol(name)
    except ValueError as exc:
        raise ConfigError(f"{where('protocol')}: {exc}") from None
    return ProtocolSpec(name, from_mapping(protocol.params, params, "",
                                           lambda key: where(f"protocol.{key}")))

