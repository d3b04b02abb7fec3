"""Availability: when each worker of a population is online.

A worker is online over a set of intervals ``[from, to)`` of run time (seconds since the
run's start); outside them it computes and sends nothing, and the server treats it as a
worker that left. Sources:

- `load_availability`: a CSV trace with columns ``worker, online_from_s, online_to_s``,
  one row per interval. Ranks must be those of the run; intervals must have
  ``0 <= from < to`` and a worker's intervals must not overlap (touching ones merge). A
  worker with no row is never online (a trace lists when each worker is there).
- `exponential_availability`: alternating on and off periods drawn from exponential
  distributions of given means; each worker starts online with the stationary
  probability ``on / (on + off)``.
- `diurnal_availability`: one online window a day per worker, of ``online_fraction x
  period_s``, starting at a phase drawn uniformly over the day (time zones), shifted each
  day by a normal jitter.

Generators are seeded: the same seed gives the same trace.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asyncsync.hetero.traces import TraceError, csv_rows, number, rank_of, write_whole

AVAILABILITY_COLUMNS = ("worker", "online_from_s", "online_to_s")


@dataclass(frozen=True)
class OnlineTimes:
    """One worker's online intervals ``[from, to)``, sorted, disjoint and not touching."""

    intervals: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        previous = -math.inf
        for start, stop in self.intervals:
            if not 0 <= start < stop or start <= previous:
                raise ValueError(f"intervals must be sorted, disjoint, with 0 <= from < to; "
                                 f"got {self.intervals}")
            previous = stop

    @classmethod
    def always(cls) -> OnlineTimes:
        """Online throughout."""
        return cls(((0.0, math.inf),))

    def _last_started(self, t: float) -> int:
        """The index of the last interval starting at or before `t` (-1: none), found by
        bisection: a worker's transitions cost O(log n) each, not O(n)."""
        return bisect.bisect_right(self.intervals, (t, math.inf)) - 1

    def online_at(self, t: float) -> bool:
        """Whether the worker is online at time `t`."""
        index = self._last_started(t)
        return index >= 0 and t < self.intervals[index][1]

    def offline_at(self, t: float) -> float:
        """When the worker, online at `t`, next goes offline (inf: never); `t` itself when
        it is offline at `t`."""
        index = self._last_started(t)
        return self.intervals[index][1] if index >= 0 and t < self.intervals[index][1] else t

    def online_from(self, t: float) -> float | None:
        """The first time at or after `t` at which the worker is online (None: never)."""
        index = self._last_started(t)
        if index >= 0 and t < self.intervals[index][1]:
            return t
        return self.intervals[index + 1][0] if index + 1 < len(self.intervals) else None

    def clipped(self, end_s: float) -> OnlineTimes:
        """The intervals that start before `end_s` (the run's budget), one that reaches it
        open to the end (a worker is not taken offline as the run stops)."""
        return OnlineTimes(tuple((a, math.inf if b >= end_s else b)
                                 for a, b in self.intervals if a < end_s))

    def online_s(self, end_s: float) -> float:
        """Seconds online within ``[0, end_s)``."""
        return sum(max(0.0, min(b, end_s) - a) for a, b in self.intervals if a < end_s)


def merged(intervals: Iterable[tuple[float, float]]) -> OnlineTimes:
    """`OnlineTimes` of sorted, non-overlapping intervals, touching ones merged."""
    out: list[tuple[float, float]] = []
    for start, stop in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return OnlineTimes(tuple(out))


def load_availability(path: str | Path, workers: int) -> list[OnlineTimes]:
    """Each rank's online intervals from a CSV trace (see the module docstring).

    Raises:
        TraceError: an unknown worker, a negative or empty interval, overlapping intervals
            of one worker, or a malformed row (the error names the file and the line).
    """
    rows: dict[int, list[tuple[float, float, int]]] = {}
    for line, row in csv_rows(path, AVAILABILITY_COLUMNS):
        rank = rank_of(path, line, row, workers)
        start = number(path, line, row, "online_from_s")
        stop = number(path, line, row, "online_to_s")
        if start < 0 or stop < 0:
            raise TraceError(path, line, f"negative interval [{start:g}, {stop:g}): times "
                                         "are seconds since the run's start")
        if stop <= start:
            raise TraceError(path, line, f"empty interval [{start:g}, {stop:g}): "
                                         "online_to_s must exceed online_from_s")
        rows.setdefault(rank, []).append((start, stop, line))
    times = [OnlineTimes(())] * workers
    for rank, intervals in rows.items():
        intervals.sort()
        for (_, stop, _), (start, _, line) in itertools.pairwise(intervals):
            if start < stop:
                raise TraceError(path, line, f"worker {rank}: interval starting at "
                                             f"{start:g} overlaps one ending at {stop:g}")
        times[rank] = merged((a, b) for a, b, _ in intervals)
    return times


def exponential_availability(workers: int, mean_online_s: float, mean_offline_s: float,
                             horizon_s: float, seed: int) -> list[OnlineTimes]:
    """On/off periods drawn from exponential distributions up to `horizon_s`."""
    if min(mean_online_s, mean_offline_s, horizon_s) <= 0:
        raise ValueError("mean_online_s, mean_offline_s and horizon_s must be > 0")
    rng = np.random.default_rng(seed)
    share = mean_online_s / (mean_online_s + mean_offline_s)
    times = []
    for _ in range(workers):
        online, t, intervals = bool(rng.random() < share), 0.0, []
        while t < horizon_s:
            length = float(rng.exponential(mean_online_s if online else mean_offline_s))
            if online and length > 0:
                intervals.append((t, min(t + length, horizon_s)))
            t += length
            online = not online
        times.append(merged(intervals))
    return times


def diurnal_availability(workers: int, period_s: float, online_fraction: float,
                         jitter_s: float, horizon_s: float, seed: int) -> list[OnlineTimes]:
    """One window of ``online_fraction x period_s`` a period per worker, at a uniform
    phase shifted each period by Normal(0, `jitter_s`), up to `horizon_s`."""
    if period_s <= 0 or horizon_s <= 0 or jitter_s < 0 or not 0 < online_fraction <= 1:
        raise ValueError("period_s and horizon_s must be > 0, jitter_s >= 0, "
                         "online_fraction in (0, 1]")
    rng = np.random.default_rng(seed)
    window = online_fraction * period_s
    times = []
    for _ in range(workers):
        phase = float(rng.uniform(0, period_s))
        intervals = []
        for day in range(-1, math.ceil(horizon_s / period_s) + 1):
            start = day * period_s + phase + float(rng.normal(0, jitter_s) if jitter_s else 0)
            start, stop = max(0.0, start), min(horizon_s, start + window)
            if start < stop:
                intervals.append((start, stop))
        times.append(merged(intervals))
    return times


def all_offline(times: list[OnlineTimes], end_s: float) -> list[tuple[float, float]]:
    """The spans within ``[0, end_s)`` during which no worker is online (the run pauses)."""
    changes: dict[float, int] = {0.0: 0}
    for worker in times:
        for start, stop in worker.intervals:
            changes[start] = changes.get(start, 0) + 1
            changes[stop] = changes.get(stop, 0) - 1
    gaps, online, since = [], 0, 0.0
    for t in sorted(changes):
        if t >= end_s:
            break
        was = online
        online += changes[t]
        if was == 0 and online > 0 and t > since:
            gaps.append((since, t))
        elif was > 0 and online == 0:
            since = t
    if online == 0 and since < end_s:
        gaps.append((since, end_s))
    return gaps


def write_availability(path: str | Path, times: list[OnlineTimes], comment: str = "") -> None:
    """Write `times` (finite intervals) as a CSV trace, `comment` as ``#`` lines first.
    Times are written to the millisecond; an interval that is empty at that precision is
    left out (it would not read back).

    Raises:
        ValueError: no worker is ever online (a trace of no rows is refused when read),
            before anything is written.
    """
    rows = []
    for rank, worker in enumerate(times):
        rounded = ((f"{start:.3f}", f"{stop:.3f}") for start, stop in worker.intervals)
        rows += [f"{rank},{start},{stop}" for start, stop in rounded
                 if float(start) < float(stop)]
    if not rows:
        raise ValueError("no worker is ever online: an availability trace needs at least "
                         "one interval")
    lines = [f"# {line}" for line in comment.splitlines()]
    write_whole(path, "\n".join([*lines, ",".join(AVAILABILITY_COLUMNS), *rows]) + "\n")
