"""A run's population: each worker's availability and device capacity, from its recipe.

The traces are read (or generated) once per process and run (cached by their sections,
the workers, the seed and the budget, and a trace file's size and modification time), so
the recipe's checks, the set-up of every worker and the summary see the same population.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncsync.hetero.availability import (
    OnlineTimes,
    all_offline,
    diurnal_availability,
    exponential_availability,
    load_availability,
)
from asyncsync.hetero.capacity import Capacity, assign_rows, load_capacity

GENERATORS = ("exponential", "diurnal")
MAX_PERIODS = 10_000_000
"""The most online and offline periods a generator may draw for a run (a guard against
means or days far shorter than the budget, which would take minutes and gigabytes)."""


@dataclass(frozen=True)
class Population:
    """Each rank's online times (None: all online throughout) and capacity row (None:
    the recipe's compute and network sections decide)."""

    times: list[OnlineTimes] | None
    capacity: list[Capacity] | None
    source: str
    end_s: float
    digests: dict[str, str]
    """Each trace file's SHA-256 by its path, as read: the logs say which population ran
    even after a trace is edited."""

    def online(self, rank: int) -> OnlineTimes | None:
        """Worker `rank`'s online intervals within the budget (None: online throughout)."""
        return None if self.times is None else self.times[rank]

    def facts(self) -> dict[str, Any]:
        """What summary.json records: the capacity row each rank got, how much of the
        budget the population was online (and wholly offline), and each trace's digest."""
        out: dict[str, Any] = {}
        if self.capacity is not None:
            out["capacity_rows"] = [row.row for row in self.capacity]
        if self.digests:
            out["trace_sha256"] = dict(self.digests)
        if self.times is not None:
            shares = [t.online_s(self.end_s) / self.end_s for t in self.times]
            gaps = all_offline(self.times, self.end_s)
            out["availability"] = {
                "source": self.source, "mean_online_share": round(sum(shares) / len(shares), 4),
                "never_online": sum(1 for t in self.times if not t.intervals),
                "all_offline_s": round(sum(b - a for a, b in gaps), 3),
                "all_offline_spans": [[round(a, 3), round(b, 3)] for a, b in gaps[:20]]}
        return out


_CACHE: dict[str, Population] = {}


def _stamp(path: str) -> list[float]:
    """A trace file's size and modification time (a changed file is read again)."""
    if not path:
        return []
    try:
        stat = Path(path).stat()
    except OSError:
        return []
    return [stat.st_size, stat.st_mtime]


def population(availability: dict[str, Any], capacity_trace: str, workers: int,
               seed: int, end_s: float) -> Population:
    """The population a run's ``availability`` keys (a table of `AvailabilitySpec`'s
    fields) and capacity trace describe (see the module docstring).

    Raises:
        TraceError: a trace file is malformed (the error names the file and the line).
    """
    key = json.dumps([availability, capacity_trace, workers, seed, end_s,
                      _stamp(availability["trace"]), _stamp(capacity_trace)], sort_keys=True)
    known = _CACHE.get(key)
    if known is None:
        times, source = _times(availability, workers, seed, end_s)
        rows = (assign_rows(load_capacity(capacity_trace), workers, seed) if capacity_trace
                else None)
        digests = {path: _sha256(path) for path in (availability["trace"], capacity_trace)
                   if path}
        known = _CACHE[key] = Population(times, rows, source, end_s, digests)
    return known


def _sha256(path: str) -> str:
    """A trace file's SHA-256 (hex), read once more after its loader read it whole."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _times(keys: dict[str, Any], workers: int, seed: int, end_s: float,
           ) -> tuple[list[OnlineTimes] | None, str]:
    if keys["generator"]:
        _check_draws(keys, workers, end_s)
    if keys["trace"]:
        times = load_availability(keys["trace"], workers)
        source = keys["trace"]
    elif keys["generator"] == "exponential":
        times = exponential_availability(workers, keys["mean_online_s"],
                                         keys["mean_offline_s"], end_s, seed)
        source = "exponential"
    elif keys["generator"] == "diurnal":
        times = diurnal_availability(workers, keys["period_s"], keys["online_fraction"],
                                     keys["jitter_s"], end_s, seed)
        source = "diurnal"
    else:
        return None, ""
    return [t.clipped(end_s) for t in times], source



def _check_draws(keys: dict[str, Any], workers: int, end_s: float) -> None:
    """Refuse a generator that would draw more than `MAX_PERIODS` periods over the budget.

    Raises:
        ValueError: naming the generator, the estimate and the keys that set it.
    """
    if keys["generator"] == "exponential":
        periods = 2 * workers * end_s / (keys["mean_online_s"] + keys["mean_offline_s"])
        keys_named = "mean_online_s and mean_offline_s"
    else:
        periods = workers * (math.ceil(end_s / keys["period_s"]) + 2)
        keys_named = "period_s"
    if periods > MAX_PERIODS:
        raise ValueError(f"availability: the {keys['generator']} generator would draw about "
                         f"{periods:,.0f} periods for {workers} workers over {end_s:g} s "
                         f"(at most {MAX_PERIODS:,}): {keys_named} are far shorter than the "
                         "budget")
