"""The heterogeneity sections of a run: ``compute`` (what a step costs and how slow each
worker is), ``network`` (each worker's link and who shapes it), ``availability`` (when each
worker is online) and ``capacity`` (per-worker speeds and bandwidths from a trace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from asyncsync.engine.channel import CHANNELS
from asyncsync.hetero.compute import PROFILES, ComputeProfile, build_profile, profile_params
from asyncsync.hetero.cost_model import DEFAULT_DEVICE, DEVICES, device
from asyncsync.hetero.network import EMULATIONS, LinkSpec
from asyncsync.schema import option
from asyncsync.study.population import GENERATORS
from asyncsync.wire.codecs import CODECS, Compressor

BATCHED_CHOICES = ("auto", "on", "off")
TOPK_FRACTION = 0.01


def _finite_positive(value: float) -> bool:
    return 0 < value < math.inf


PerWorker = float | list[float]


def _non_negative(value: PerWorker | None) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(v is None or v >= 0 for v in values)


def _loss(value: PerWorker) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(0 <= v < 100 for v in values)


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
    batched: str = option("auto", lambda v: v in BATCHED_CHOICES,
                          f"must be one of {', '.join(BATCHED_CHOICES)}",
                          "virtual clock: compute the workers' pending steps as one batched "
                          "call (on), one by one (off), or batched on a CUDA device only "
                          "(auto); see docs/gpu.md")

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


PER_WORKER_LINKS = ("bandwidth_mbps", "uplink_mbps", "downlink_mbps", "latency_ms",
                    "jitter_ms", "loss_pct")
"""`NetworkSpec`'s keys that take a value per worker."""


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
                                "(0 = unlimited; virtual clock, or emulation = \"kernel\")")
    loss_pct: PerWorker = option(0.0, _loss, "must be in [0, 100)",
                                 "random packet loss in each direction, % (virtual clock: "
                                 "TCP's loss-limited rate; real clock: emulation = "
                                 "\"kernel\")")
    emulation: str = option("app", lambda v: v in EMULATIONS,
                            f"must be one of {', '.join(EMULATIONS)}",
                            "real clock: who shapes the links: app (the client paces its "
                            "bytes and sleeps the latency) or kernel (network namespaces "
                            "and tc qdiscs; needs root, ip and tc)")
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
        if not self.error_feedback and self.compression == "none":
            raise ValueError("error_feedback is only used with a lossy compression "
                             "(compression is 'none')")

    def compressor(self) -> Compressor | None:
        """A fresh codec state for one worker (None: pushes go as float32)."""
        if self.compression == "none":
            return None
        return Compressor(self.compression, self.topk_fraction, self.error_feedback)

    def link(self, rank: int) -> LinkSpec:
        up = self.bandwidth_mbps if self.uplink_mbps is None else self.uplink_mbps
        down = self.bandwidth_mbps if self.downlink_mbps is None else self.downlink_mbps
        return LinkSpec(_pick(up, rank), _pick(down, rank), _pick(self.latency_ms, rank),
                        _pick(self.jitter_ms, rank), _pick(self.loss_pct, rank))


GENERATOR_KEYS = {"mean_online_s": "exponential", "mean_offline_s": "exponential",
                  "period_s": "diurnal", "online_fraction": "diurnal", "jitter_s": "diurnal"}
"""Each generator's own keys: one set where its generator is not chosen is refused."""

MERGED = ("; a run's availability table is merged key by key into [defaults.availability]: "
          "reset the defaults' other keys in the run's table (trace = \"\") or give each "
          "run its own table")
"""The hint on a refused mix, which is most often a run's table merged with the defaults'."""


@dataclass(frozen=True)
class AvailabilitySpec:
    """When each worker is online: a CSV trace or a seeded generator (none: always)."""

    trace: str = option("", help="CSV trace: worker, online_from_s, online_to_s (seconds "
                                 "since the run's start; a worker without rows is never "
                                 "online); relative to the working directory")
    generator: str = option("", lambda v: v in ("", *GENERATORS),
                            f"must be one of {', '.join(GENERATORS)} (or empty)",
                            "draw the intervals with the run's seed instead of a trace")
    mean_online_s: float = option(600.0, _finite_positive, "must be > 0 and finite",
                                  "exponential: mean length of an online period")
    mean_offline_s: float = option(600.0, _finite_positive, "must be > 0 and finite",
                                   "exponential: mean length of an offline period")
    period_s: float = option(86400.0, _finite_positive, "must be > 0 and finite",
                             "diurnal: the day's length")
    online_fraction: float = option(0.3, lambda v: 0 < v <= 1, "must be in (0, 1]",
                                    "diurnal: share of each day a worker is online")
    jitter_s: float = option(0.0, lambda v: 0 <= v < math.inf, "must be >= 0 and finite",
                             "diurnal: std. dev. of a day's window start around the phase")

    def __post_init__(self) -> None:
        if self.trace and self.generator:
            raise ValueError(f"availability: give a trace or a generator, not both (trace "
                             f"{self.trace!r}, generator {self.generator!r}){MERGED}")
        defaults = {f.name: f.default for f in fields(self)}
        for key, generator in GENERATOR_KEYS.items():
            if self.generator != generator and getattr(self, key) != defaults[key]:
                raise ValueError(f"availability: {key} is only used with generator = "
                                 f"\"{generator}\" (generator is \"{self.generator}\")"
                                 f"{MERGED}")


@dataclass(frozen=True)
class CapacitySpec:
    """Each worker's compute speed and link bandwidth from a trace (none: the compute and
    network sections decide)."""

    trace: str = option("", help="CSV trace: worker, s_per_sample or flops_per_s, up_mbps, "
                                 "down_mbps; rows drawn with the seed when the trace is "
                                 "shorter than the population")
