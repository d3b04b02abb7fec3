"""Compute heterogeneity: per-worker slowness, and the one rule for a step's duration.

A profile is a pure function of the run's time t (seconds since the run started, on the
one clock): ``factor_at(t)`` is the slowdown in force, and ``padding(t, c)`` how long a
step whose computation took c seconds is padded. The worker's compute seam applies the
padding (real mode: an asyncio sleep after the real step, counted as computation).

A profile a recipe can name (``compute.profile = { name = ... }``) is one class that
subclasses `RecipeProfile` and registers itself with `register_profile`: its parameter
dataclass and how each rank's instance is made from it. The registered ones:

- `StepDelay` (``step_delay``): a fixed sleep per step (the WBSP code's setting).
- `RandomSlowdown` (``random``): a factor drawn uniformly from [low, high], re-drawn every
  `period_s` seconds, seeded by (seed, rank, period index): reproducible.
- `PeriodicStraggler` (``periodic``): worker k is f times slower for d seconds every p.
- `MovingStraggler` (``moving``): one worker at a time is f times slower; the role moves
  to the next rank every `dwell_s` seconds.
- `TraceSlowdown` (``trace``): factors from a CSV trace (time_s, worker, factor).

`StaticSlowdown` (a constant factor, the recipe's ``compute.slowdown``) and `Scaled` (a
static factor times a profile) complete them.

Paced steps (virtual time always, real mode with ``compute.base_step_s``): a step lasts
`step_seconds`, its `StepCost` (``base_step_s`` for the reference batch, in proportion to
the batch it computes, or the step's FLOPs over a device's rate) padded by the profile.
That one function serves both clocks; a real computation longer than it overruns (the seam
counts overruns).
"""

from __future__ import annotations

import bisect
import math
import random
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from asyncsync.hetero.traces import TraceError, csv_rows, number, rank_of, unreadable
from asyncsync.schema import check_fields, from_mapping, option


class StepCost(Protocol):
    """What one local step costs before slowness, by its batch size: a `FixedStepCost`
    (``compute.base_step_s``, given or calibrated) or a device's FLOP rate
    (`asyncsync.hetero.cost_model.DeviceStepCost`)."""

    def base_s(self, batch: int) -> float:
        """Seconds a step of `batch` samples costs (0: the reference batch)."""
        ...


@dataclass(frozen=True)
class FixedStepCost:
    """`base_step_s` seconds for `reference_batch` samples, in proportion for other batch
    sizes."""

    base_step_s: float
    reference_batch: int

    def __post_init__(self) -> None:
        if not self.base_step_s > 0:
            raise ValueError(f"base_step_s must be > 0, got {self.base_step_s}")
        if self.reference_batch < 1:
            raise ValueError(f"reference_batch must be >= 1, got {self.reference_batch}")

    def base_s(self, batch: int) -> float:
        """Seconds a step of `batch` samples costs (0: the reference batch)."""
        return self.base_step_s * (batch / self.reference_batch if batch else 1.0)


def step_seconds(profile: ComputeProfile, t: float, cost: StepCost, batch: int) -> float:
    """The duration of a paced step of `batch` samples at run time `t`: its base cost,
    padded by `profile` (the one step-time rule of both clocks)."""
    base = cost.base_s(batch)
    return base + profile.padding(t, base)


class ComputeProfile:
    """Base: a factor that depends on the run's time `t` (1 by default)."""

    def factor_at(self, t: float) -> float:
        """The slowdown factor in force at run time `t`."""
        return 1.0

    def padding(self, t: float, compute_s: float) -> float:
        """Seconds to add after a step, at run time `t`, whose computation took `compute_s`."""
        return (self.factor_at(t) - 1.0) * compute_s


@dataclass(frozen=True)
class StepDelayParams:
    seconds: float | list[float] = option(0.5, help="sleep per step (one value or per rank)")
    ranks: str = option("all", lambda v: v in ("all", "odd", "even"),
                        "must be 'all', 'odd' or 'even'", "which ranks sleep")

    def __post_init__(self) -> None:
        check_fields(self)
        values = self.seconds if isinstance(self.seconds, list) else [self.seconds]
        if any(v < 0 for v in values):
            raise ValueError(f"seconds: must be >= 0, got {self.seconds!r}")


@dataclass(frozen=True)
class RandomParams:
    low: float = option(1.0, lambda v: v >= 1, "must be >= 1")
    high: float = option(4.0, lambda v: v >= 1, "must be >= 1")
    period_s: float = option(10.0, lambda v: v > 0, "must be > 0", "re-draw interval")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.high < self.low:
            raise ValueError(f"high: must be >= low ({self.low}), got {self.high}")


@dataclass(frozen=True)
class PeriodicParams:
    worker: int = option(0, lambda v: v >= 0, "must be >= 0", "the straggling rank")
    factor: float = option(4.0, lambda v: v >= 1, "must be >= 1")
    duration_s: float = option(5.0, lambda v: v > 0, "must be > 0")
    period_s: float = option(20.0, lambda v: v > 0, "must be > 0")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.duration_s > self.period_s:
            raise ValueError(f"duration_s: must be <= period_s, got {self.duration_s}")


@dataclass(frozen=True)
class MovingParams:
    factor: float = option(4.0, lambda v: v >= 1, "must be >= 1")
    dwell_s: float = option(10.0, lambda v: v > 0, "must be > 0",
                            "seconds before the role moves to the next rank")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TraceParams:
    path: str = option("", bool, "must name a CSV file (time_s, worker, factor)")

    def __post_init__(self) -> None:
        check_fields(self)
        read_trace(self.path)


P = TypeVar("P", bound="type[RecipeProfile]")
PROFILES: dict[str, type[RecipeProfile]] = {}
"""The profiles a recipe can name, by name (see `register_profile`)."""


class RecipeProfile(ComputeProfile):
    """A profile a recipe names in ``compute.profile``: `params` is its parameter dataclass
    (validated field by field), `for_rank` makes one rank's instance from it."""

    params: ClassVar[type[Any]]

    @classmethod
    @abstractmethod
    def for_rank(cls, params: Any, rank: int, workers: int, seed: int) -> ComputeProfile:
        """The profile of worker `rank` of `workers` in a run seeded `seed`."""

    @classmethod
    def check_ranks(cls, params: Any, workers: int) -> None:
        """Raise a ValueError naming the key where `params` name a rank that a run of
        `workers` lacks (a setting that would be ignored unseen)."""


def register_profile(name: str) -> Callable[[P], P]:
    """Make a `RecipeProfile` class nameable as ``compute.profile = { name = ... }``."""

    def add(cls: P) -> P:
        if name in PROFILES:
            raise ValueError(f"compute profile {name!r} is already registered")
        PROFILES[name] = cls
        return cls

    return add


class StaticSlowdown(ComputeProfile):
    """A constant factor f >= 1."""

    def __init__(self, factor: float) -> None:
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"slowdown factor must be a finite number >= 1, got {factor}")
        self._factor = factor

    def factor_at(self, t: float) -> float:
        return self._factor


@register_profile("step_delay")
class StepDelay(RecipeProfile):
    """A fixed sleep of `seconds` per step, whatever the computation took."""

    params = StepDelayParams

    @classmethod
    def for_rank(cls, params: StepDelayParams, rank: int, workers: int,
                 seed: int) -> StepDelay:
        cls.check_ranks(params, workers)
        seconds = params.seconds
        delay = (seconds[rank] if rank < len(seconds) else 0.0) if isinstance(seconds, list) \
            else seconds
        selected = params.ranks == "all" or (rank % 2 == 1) == (params.ranks == "odd")
        return cls(delay if selected else 0.0)

    @classmethod
    def check_ranks(cls, params: StepDelayParams, workers: int) -> None:
        if isinstance(params.seconds, list) and len(params.seconds) > workers:
            raise ValueError(f"profile.seconds: {len(params.seconds)} entries for {workers} "
                             f"workers: entries past worker {workers - 1} would be ignored "
                             "(give at most one per worker; missing ones are 0)")

    def __init__(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"step delay must be a finite number >= 0, got {seconds}")
        self.seconds = seconds

    def padding(self, t: float, compute_s: float) -> float:
        return self.seconds


@register_profile("random")
class RandomSlowdown(RecipeProfile):
    """Uniform factors in [low, high], re-drawn every `period_s` seconds (seeded)."""

    params = RandomParams

    @classmethod
    def for_rank(cls, params: RandomParams, rank: int, workers: int,
                 seed: int) -> RandomSlowdown:
        return cls(params.low, params.high, params.period_s, seed, rank)

    def __init__(self, low: float, high: float, period_s: float, seed: int, rank: int) -> None:
        if not (math.isfinite(high) and 1 <= low <= high):
            raise ValueError(f"need finite 1 <= low <= high, got low={low}, high={high}")
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be a finite number > 0, got {period_s}")
        self.low, self.high, self.period_s = low, high, period_s
        self.seed, self.rank = seed, rank

    def factor_at(self, t: float) -> float:
        epoch = int(t // self.period_s)
        draw = random.Random(f"{self.seed}/{self.rank}/{epoch}").random()
        return self.low + (self.high - self.low) * draw


@register_profile("periodic")
class PeriodicStraggler(RecipeProfile):
    """Worker `worker` is `slow` times slower for `duration_s` out of every `period_s`."""

    params = PeriodicParams

    @classmethod
    def for_rank(cls, params: PeriodicParams, rank: int, workers: int,
                 seed: int) -> PeriodicStraggler:
        cls.check_ranks(params, workers)
        return cls(params.worker, params.factor, params.duration_s, params.period_s, rank)

    @classmethod
    def check_ranks(cls, params: PeriodicParams, workers: int) -> None:
        if params.worker >= workers:
            raise ValueError(f"profile.worker: {params.worker} is not a rank of this run's "
                             f"{workers} workers (0..{workers - 1}): it would never straggle")

    def __init__(self, worker: int, slow: float, duration_s: float, period_s: float,
                 rank: int) -> None:
        if not (math.isfinite(slow) and slow >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {slow}")
        if not 0 < duration_s <= period_s:
            raise ValueError(f"need 0 < duration_s <= period_s, got {duration_s}, {period_s}")
        self.worker, self.slow = worker, slow
        self.duration_s, self.period_s, self.rank = duration_s, period_s, rank

    def factor_at(self, t: float) -> float:
        straggling = self.rank == self.worker and t % self.period_s < self.duration_s
        return self.slow if straggling else 1.0


@register_profile("moving")
class MovingStraggler(RecipeProfile):
    """One straggler at a time: rank ``floor(t / dwell_s) mod workers`` is `slow` x slower."""

    params = MovingParams

    @classmethod
    def for_rank(cls, params: MovingParams, rank: int, workers: int,
                 seed: int) -> MovingStraggler:
        return cls(params.factor, params.dwell_s, workers, rank)

    def __init__(self, slow: float, dwell_s: float, workers: int, rank: int) -> None:
        if not (math.isfinite(slow) and slow >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {slow}")
        if not (math.isfinite(dwell_s) and dwell_s > 0):
            raise ValueError(f"dwell_s must be a finite number > 0, got {dwell_s}")
        self.slow, self.dwell_s, self.workers, self.rank = slow, dwell_s, workers, rank

    def factor_at(self, t: float) -> float:
        return self.slow if int(t // self.dwell_s) % self.workers == self.rank else 1.0


@register_profile("trace")
class TraceSlowdown(RecipeProfile):
    """Factors from a CSV trace with columns ``time_s, worker, factor`` (a header row is
    allowed); a worker's factor holds from its row's time until its next row, 1 before."""

    params = TraceParams

    @classmethod
    def for_rank(cls, params: TraceParams, rank: int, workers: int,
                 seed: int) -> TraceSlowdown:
        return cls(params.path, rank, workers)

    @classmethod
    def check_ranks(cls, params: TraceParams, workers: int) -> None:
        try:
            read_trace(params.path, workers)
        except TraceError as exc:
            raise ValueError(f"profile.path: {exc}") from None

    def __init__(self, path: str | Path, rank: int, workers: int | None = None) -> None:
        self.points = read_trace(path, workers).get(rank, [])
        self._starts = [start for start, _ in self.points]

    def factor_at(self, t: float) -> float:
        """The factor of the last row at or before `t` (1 before the first): a binary
        search, O(log rows) a step."""
        index = bisect.bisect_right(self._starts, t)
        return self.points[index - 1][1] if index else 1.0


def read_trace(path: str | Path, workers: int | None = None,
               ) -> dict[int, list[tuple[float, float]]]:
    """Parse a trace CSV into sorted ``(time_s, factor)`` points per worker.

    The file is read as every CSV trace is (`asyncsync.hetero.traces.csv_rows`: a header
    naming ``time_s, worker, factor``, ``#`` comments and blank lines skipped, every row as
    wide as the header). Each row needs a ``time_s >= 0``, a rank (below `workers` when
    given) and a factor in ``[1, MAX_FACTOR]``; a worker's times must increase down the
    file (a time repeated would leave its factor to chance): anything else is a
    `TraceError` naming the file and line. The last file parsed is
    kept (by path, size and modification time): each rank's profile reads the same file,
    and a thousand ranks would otherwise parse it a thousand times.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(path, 0, unreadable(path, exc)) from exc
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _LAST_TRACE:
        points = _parse_trace(path, None)
        _LAST_TRACE.clear()
        _LAST_TRACE[key] = points
    points = _LAST_TRACE[key]
    if workers is not None and points and max(points) >= workers:
        return _parse_trace(path, workers)  # (raises, naming the first unknown worker's line)
    return points


_LAST_TRACE: dict[tuple[str, int, int], dict[int, list[tuple[float, float]]]] = {}


def _parse_trace(path: Path, workers: int | None) -> dict[int, list[tuple[float, float]]]:
    """`read_trace`'s parse of the file, read afresh."""
    points: dict[int, list[tuple[float, float]]] = {}
    last: dict[int, tuple[float, int]] = {}  # each worker's latest time and its line
    for line, row in csv_rows(path, TRACE_COLUMNS):
        t = number(path, line, row, "time_s")
        rank = rank_of(path, line, row, workers)
        factor = number(path, line, row, "factor")
        if t < 0:
            raise TraceError(path, line, f"time_s {t:g} is negative: times are seconds since "
                                         "the run's start")
        if not 1 <= factor <= MAX_FACTOR:
            bound = "below 1" if factor < 1 else f"over {MAX_FACTOR:g}"
            raise TraceError(path, line, f"factor {factor:g} is {bound}: a factor is a "
                                         "slowdown (1: full speed)")
        if rank in last and t <= last[rank][0]:
            earlier, at = last[rank]
            order = (f"repeats line {at} (one row per time)" if t == earlier else
                     f"comes before line {at}'s {earlier:g} (a worker's rows must be in time "
                     "order)")
            raise TraceError(path, line, f"worker {rank}: time_s {t:g} {order}")
        last[rank] = (t, line)
        points.setdefault(rank, []).append((t, factor))
    return points


TRACE_COLUMNS = ("time_s", "worker", "factor")
"""A compute trace's columns (the header names them, in any order)."""
MAX_FACTOR = 1e6
"""The largest slowdown read: a million times slower is no device running (a capacity
trace's `asyncsync.hetero.capacity.LIMITS` end at a million seconds a sample)."""


class Scaled(ComputeProfile):
    """A profile whose factor is multiplied by a constant (static slowdown x profile)."""

    def __init__(self, inner: ComputeProfile, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def factor_at(self, t: float) -> float:
        return self.scale * self.inner.factor_at(t)

    def padding(self, t: float, compute_s: float) -> float:
        inner = self.inner.padding(t, compute_s)
        return inner + (self.scale - 1.0) * (compute_s + inner)


def profile_params(table: dict[str, Any]) -> Any:
    """Validate a recipe's ``compute.profile`` table into its parameter dataclass."""
    rest = dict(table)
    name = rest.pop("name", None)
    if name not in PROFILES:
        raise ValueError(f"profile.name: must be one of {', '.join(PROFILES)}, got {name!r}")
    return from_mapping(PROFILES[name].params, rest, "profile")


def check_profile(table: dict[str, Any], workers: int) -> None:
    """Raise a ValueError naming the key (``profile.*``) where a ``compute.profile`` table
    names a rank that a run of `workers` lacks: a periodic straggler past the last worker,
    more per-rank delays than workers, a trace row of an unknown worker."""
    if table:
        PROFILES[table["name"]].check_ranks(profile_params(table), workers)


def build_profile(table: dict[str, Any], factor: float, rank: int, workers: int,
                  seed: int) -> ComputeProfile:
    """The compute profile of worker `rank`: static `factor` x the profile table's
    factors (an empty table: the static factor alone)."""
    if not table:
        return StaticSlowdown(factor)
    profile = PROFILES[table["name"]].for_rank(profile_params(table), rank, workers, seed)
    return Scaled(profile, factor) if factor != 1.0 else profile
