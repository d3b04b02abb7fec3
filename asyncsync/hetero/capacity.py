"""Device capacity: each worker's measured compute speed and link bandwidth, from a trace.

A capacity trace is a CSV file with columns ``worker`` (the row's id: a client of the
source trace), one of ``s_per_sample`` (seconds a sample's forward and backward take) or
``flops_per_s`` (sustained FLOP/s), and ``up_mbps`` and ``down_mbps`` (Mbit/s). Every
figure must be > 0 (a zero speed or bandwidth is an error, never "unlimited") and within
`LIMITS`.

`assign_rows` gives each rank of a run one row: row ``r`` to rank ``r`` when the ids cover
the ranks, else rows drawn with the run's seed (without replacement when the trace has
enough rows, with replacement when the population is larger than the trace). The run's
summary records which row each rank got.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asyncsync.hetero.traces import (
    TraceError,
    content_lines,
    csv_rows,
    number,
    rank_of,
    write_whole,
)

SPEED_COLUMNS = ("s_per_sample", "flops_per_s")
LINK_COLUMNS = ("up_mbps", "down_mbps")
LIMITS = {"s_per_sample": (0.0, 1e6), "flops_per_s": (1e3, math.inf),
          "up_mbps": (1e-6, math.inf), "down_mbps": (1e-6, math.inf)}
"""Each figure's bounds (inclusive; every figure is above 0 too). Beyond them no device is
described (over 11 days a sample, under 1,000 FLOP/s or 1 bit/s), and a step or a
transfer of some 10^15 virtual seconds stalls the virtual clock."""


def figure_problem(name: str, value: float) -> str | None:
    """Why `value` cannot be column `name` of a capacity row (None: it can)."""
    low, high = LIMITS[name]
    if value <= 0:
        kind = "speed" if name in SPEED_COLUMNS else "bandwidth"
        return f"zero or negative {kind}: {name} = {value:g} (must be > 0)"
    if low <= value <= high:
        return None
    bound = f"at most {high:g}" if value > high else f"at least {low:g}"
    return f"{name} = {value:g} is beyond any device ({bound})"


@dataclass(frozen=True)
class Capacity:
    """One row of a capacity trace: its id, its speed (exactly one of the two) and its
    link's bandwidth each way."""

    row: int
    s_per_sample: float | None
    flops_per_s: float | None
    up_mbps: float
    down_mbps: float

    def __post_init__(self) -> None:
        if (self.s_per_sample is None) == (self.flops_per_s is None):
            raise ValueError("a capacity has exactly one of s_per_sample and flops_per_s")
        for name in (*SPEED_COLUMNS, *LINK_COLUMNS):
            value = getattr(self, name)
            if value is not None and (problem := figure_problem(name, value)):
                raise ValueError(f"capacity of row {self.row}: {problem}")


def load_capacity(path: str | Path) -> list[Capacity]:
    """The rows of a capacity trace, in file order.

    Raises:
        TraceError: a malformed row, a repeated id, or a zero or negative speed or
            bandwidth (the error names the file and the line).
    """
    rows: list[Capacity] = []
    seen: dict[int, int] = {}
    for line, row in csv_rows(path, ("worker", *LINK_COLUMNS), SPEED_COLUMNS):
        if not any(name in row for name in SPEED_COLUMNS):
            raise TraceError(path, _header_line(path), "the header names no speed column: "
                                                       "add s_per_sample or flops_per_s")
        speed = [name for name in SPEED_COLUMNS if row.get(name, "") != ""]
        if len(speed) != 1:
            raise TraceError(path, line, "give exactly one of s_per_sample and flops_per_s "
                                         f"per row (got {len(speed)})")
        ident = rank_of(path, line, row, None)
        if ident in seen:
            raise TraceError(path, line, f"worker {ident} repeats line {seen[ident]}")
        seen[ident] = line
        figures = {name: number(path, line, row, name) for name in (*speed, *LINK_COLUMNS)}
        for name, value in figures.items():
            if problem := figure_problem(name, value):
                raise TraceError(path, line, problem)
        rows.append(Capacity(ident, figures.get("s_per_sample"), figures.get("flops_per_s"),
                             figures["up_mbps"], figures["down_mbps"]))
    return rows


def _header_line(path: str | Path) -> int:
    """The line number of a CSV trace's header (its first line that is not a comment)."""
    return content_lines(Path(path).read_text(encoding="utf-8-sig"))[0][0]


def assign_rows(rows: list[Capacity], workers: int, seed: int) -> list[Capacity]:
    """Each rank's row (see the module docstring)."""
    by_id = {row.row: row for row in rows}
    if all(rank in by_id for rank in range(workers)):
        return [by_id[rank] for rank in range(workers)]
    rng = np.random.default_rng([seed, 43])
    picks = rng.choice(len(rows), size=workers, replace=workers > len(rows))
    return [rows[int(i)] for i in picks]


def write_capacity(path: str | Path, rows: list[Capacity], comment: str = "") -> None:
    """Write `rows` as a capacity trace (seconds per sample or FLOP/s, as each row has)."""
    speed = "s_per_sample" if rows and rows[0].s_per_sample is not None else "flops_per_s"
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append(f"worker,{speed},up_mbps,down_mbps")
    for row in rows:
        value = row.s_per_sample if speed == "s_per_sample" else row.flops_per_s
        if value is None:
            raise ValueError("write_capacity: every row must give the same kind of speed")
        lines.append(f"{row.row},{value:.6g},{row.up_mbps:.6g},{row.down_mbps:.6g}")
    write_whole(path, "\n".join(lines) + "\n")
