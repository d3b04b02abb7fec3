"""Compute heterogeneity: per-worker slowness applied to real computation.

A profile is a pure function of the run's time t (seconds since the run started, on the
one clock): ``factor_at(t)`` is the slowdown in force, and ``padding(t, c)`` how long a
step whose real computation took c seconds is padded. The worker's compute seam applies
the padding as an asyncio sleep after the real step, and counts it as computation. Profiles:

- `StaticSlowdown`: a constant factor f (a step lasts f * t).
- `StepDelay`: a fixed sleep per step (the WBSP code's setting: odd ranks sleep 0.5 s).
- `RandomSlowdown`: a factor drawn uniformly from [low, high], re-drawn every
  `period_s` seconds, seeded by (seed, rank, period index): reproducible.
- `PeriodicStraggler`: worker k is f times slower for d seconds every p seconds.
- `MovingStraggler`: one worker at a time is f times slower; the role moves to the
  next rank every `dwell_s` seconds.
- `TraceSlowdown`: factors from a CSV trace (time_s, worker, factor), step-wise.

`Paced` wraps any profile: each step lasts exactly ``base_step_s * factor`` (real
computation padded with sleep). When the computation alone exceeds that (the host is too
slow or contended), the step overruns; overruns are counted so a user can tell when
results are distorted by CPU contention.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncsync.schema import check_fields, from_mapping, option


class ComputeProfile:
    """Base: a factor that depends on the run's time `t` (1 by default)."""

    overruns: int = 0

    def factor_at(self, t: float) -> float:
        """The slowdown factor in force at run time `t`."""
        return 1.0

    def padding(self, t: float, compute_s: float) -> float:
        """Seconds to add after a step, at run time `t`, whose computation took `compute_s`."""
        return (self.factor_at(t) - 1.0) * compute_s

    def describe(self, t: float = 0.0) -> str:
        """A short label of the setting at run time `t` for the dashboard."""
        return f"{self.factor_at(t):.3g}x"


class StaticSlowdown(ComputeProfile):
    """A constant factor f >= 1."""

    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        self._factor = factor

    def factor_at(self, t: float) -> float:
        return self._factor


class StepDelay(ComputeProfile):
    """A fixed sleep of `seconds` per step, whatever the computation took."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"step delay must be >= 0, got {seconds}")
        self.seconds = seconds

    def padding(self, t: float, compute_s: float) -> float:
        return self.seconds

    def describe(self, t: float = 0.0) -> str:
        return f"+{self.seconds:g}s/step"


class RandomSlowdown(ComputeProfile):
    """Uniform factors in [low, high], re-drawn every `period_s` seconds (seeded)."""

    def __init__(self, low: float, high: float, period_s: float, seed: int, rank: int) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= low <= high, got low={low}, high={high}")
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.low, self.high, self.period_s = low, high, period_s
        self.seed, self.rank = seed, rank

    def factor_at(self, t: float) -> float:
        epoch = int(t // self.period_s)
        draw = random.Random(f"{self.seed}/{self.rank}/{epoch}").random()
        return self.low + (self.high - self.low) * draw


class PeriodicStraggler(ComputeProfile):
    """Worker `worker` is `slow` times slower for `duration_s` out of every `period_s`."""

    def __init__(self, worker: int, slow: float, duration_s: float, period_s: float,
                 rank: int) -> None:
        if slow < 1:
            raise ValueError(f"factor must be >= 1, got {slow}")
        if not 0 < duration_s <= period_s:
            raise ValueError(f"need 0 < duration_s <= period_s, got {duration_s}, {period_s}")
        self.worker, self.slow = worker, slow
        self.duration_s, self.period_s, self.rank = duration_s, period_s, rank

    def factor_at(self, t: float) -> float:
        straggling = self.rank == self.worker and t % self.period_s < self.duration_s
        return self.slow if straggling else 1.0


class MovingStraggler(ComputeProfile):
    """One straggler at a time: rank ``floor(t / dwell_s) mod workers`` is `slow` x slower."""

    def __init__(self, slow: float, dwell_s: float, workers: int, rank: int) -> None:
        if slow < 1:
            raise ValueError(f"factor must be >= 1, got {slow}")
        if dwell_s <= 0:
            raise ValueError(f"dwell_s must be > 0, got {dwell_s}")
        self.slow, self.dwell_s, self.workers, self.rank = slow, dwell_s, workers, rank

    def factor_at(self, t: float) -> float:
        return self.slow if int(t // self.dwell_s) % self.workers == self.rank else 1.0


class TraceSlowdown(ComputeProfile):
    """Factors from a CSV trace with columns ``time_s, worker, factor`` (a header row is
    allowed); a worker's factor holds from its row's time until its next row, 1 before."""

    def __init__(self, path: str | Path, rank: int) -> None:
        self.points = read_trace(path).get(rank, [])

    def factor_at(self, t: float) -> float:
        current = 1.0
        for start, value in self.points:
            if start > t:
                break
            current = value
        return current


def read_trace(path: str | Path) -> dict[int, list[tuple[float, float]]]:
    """Parse a trace CSV into sorted ``(time_s, factor)`` points per worker."""
    path = Path(path)
    try:
        rows = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror}") from exc
    points: dict[int, list[tuple[float, float]]] = {}
    for number, row in enumerate(rows, start=1):
        if not row or (number == 1 and not _is_number(row[0])):
            continue
        if len(row) != 3:
            raise ValueError(f"{path}:{number}: expected time_s,worker,factor")
        try:
            t, worker, value = float(row[0]), int(row[1]), float(row[2])
        except ValueError:
            raise ValueError(f"{path}:{number}: not numbers: {row}") from None
        if value < 1 or t < 0:
            raise ValueError(f"{path}:{number}: need time_s >= 0 and factor >= 1")
        points.setdefault(worker, []).append((t, value))
    return {worker: sorted(p) for worker, p in points.items()}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class Scaled(ComputeProfile):
    """A profile whose factor is multiplied by a constant (static slowdown x profile)."""

    def __init__(self, inner: ComputeProfile, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def factor_at(self, t: float) -> float:
        return self.scale * self.inner.factor_at(t)

    def padding(self, t: float, compute_s: float) -> float:
        inner = self.inner.padding(t, compute_s)
        return inner + (self.scale - 1.0) * (compute_s + inner)


class Paced(ComputeProfile):
    """Each step lasts exactly ``base_step_s * factor``; longer computations overrun."""

    def __init__(self, inner: ComputeProfile, base_step_s: float) -> None:
        if base_step_s <= 0:
            raise ValueError(f"base_step_s must be > 0, got {base_step_s}")
        self.inner, self.base_step_s = inner, base_step_s
        self.overruns = 0

    def factor_at(self, t: float) -> float:
        return self.inner.factor_at(t)

    def padding(self, t: float, compute_s: float) -> float:
        target = self.base_step_s + self.inner.padding(t, self.base_step_s)
        if compute_s > target:
            self.overruns += 1
            return 0.0
        return target - compute_s

    def describe(self, t: float = 0.0) -> str:
        return f"{self.inner.describe(t)} paced"


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


PROFILES: dict[str, type[Any]] = {
    "step_delay": StepDelayParams, "random": RandomParams, "periodic": PeriodicParams,
    "moving": MovingParams, "trace": TraceParams,
}


def profile_params(table: dict[str, Any]) -> Any:
    """Validate a recipe's ``compute.profile`` table into its parameter dataclass."""
    rest = dict(table)
    name = rest.pop("name", None)
    if name not in PROFILES:
        raise ValueError(f"profile.name: must be one of {', '.join(PROFILES)}, got {name!r}")
    return from_mapping(PROFILES[name], rest, "profile")


def build_profile(table: dict[str, Any], factor: float, base_step_s: float, rank: int,
                  workers: int, seed: int) -> ComputeProfile:
    """The compute profile of worker `rank`: static `factor` x the profile table's
    factors, paced when `base_step_s` > 0."""
    params = profile_params(table) if table else None
    profile: ComputeProfile
    if params is None:
        profile = StaticSlowdown(factor)
    elif isinstance(params, StepDelayParams):
        seconds = params.seconds
        delay = (seconds[rank] if rank < len(seconds) else 0.0) if isinstance(seconds, list) \
            else seconds
        selected = params.ranks == "all" or (rank % 2 == 1) == (params.ranks == "odd")
        profile = StepDelay(delay if selected else 0.0)
    elif isinstance(params, RandomParams):
        profile = RandomSlowdown(params.low, params.high, params.period_s, seed, rank)
    elif isinstance(params, PeriodicParams):
        profile = PeriodicStraggler(params.worker, params.factor, params.duration_s,
                                    params.period_s, rank)
    elif isinstance(params, MovingParams):
        profile = MovingStraggler(params.factor, params.dwell_s, workers, rank)
    else:
        profile = TraceSlowdown(params.path, rank)
    if params is not None and factor != 1.0:
        profile = Scaled(profile, factor)
    return Paced(profile, base_step_s) if base_step_s > 0 else profile
