"""The compute trace profile at a population's scale: its ranks read the trace file
once, not twice each (a thousand ranks of a long trace took hours), and a step's factor
comes from a binary search that agrees with a plain walk over the rows (written here,
independently of the profile)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from asyncsync.hetero import compute
from asyncsync.hetero.compute import TraceSlowdown, build_profile


def write_trace(path: Path, workers: int, rows: int, seed: int) -> dict[int, list[tuple]]:
    """A trace of `rows` rows per worker at distinct random times, each worker's in time
    order, the workers' rows interleaved at random; returns the rows per worker."""
    rng = random.Random(seed)
    given = {w: [(float(t), 1 + rng.random()) for t in sorted(rng.sample(range(50), rows))]
             for w in range(workers)}
    turns = [w for w in range(workers) for _ in range(rows)]
    rng.shuffle(turns)
    lines, written = ["time_s,worker,factor"], dict.fromkeys(given, 0)
    for worker in turns:
        t, factor = given[worker][written[worker]]
        written[worker] += 1
        lines.append(f"{t},{worker},{factor!r}")
    path.write_text("\n".join(lines) + "\n")
    return given


def walked(rows: list[tuple], t: float) -> float:
    """The factor in force at `t`: that of the latest row at or before t, 1 before all."""
    due = [row for row in rows if row[0] <= t]
    return max(due)[1] if due else 1.0


def test_factor_at_agrees_with_a_walk_over_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    given = write_trace(path, workers=3, rows=40, seed=4)
    for rank in range(3):
        profile = TraceSlowdown(path, rank, 3)
        for t in [-1.0, 0.0, 0.5, 7.0, 12.25, 49.0, 60.0, *range(50)]:
            assert profile.factor_at(float(t)) == walked(given[rank], float(t)), (rank, t)


def test_two_hundred_ranks_read_the_trace_file_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.csv"
    write_trace(path, workers=200, rows=2, seed=1)
    reads: list[Path] = []
    read_text = Path.read_text

    def counting(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting)
    table = {"name": "trace", "path": str(path)}
    profiles = [build_profile(table, 1.0, rank, 200, seed=0) for rank in range(200)]
    assert [p for p in reads if p.name == "trace.csv"] == [path]
    assert len(profiles) == 200


def test_an_edited_trace_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,factor\n0,0,2\n")
    assert TraceSlowdown(path, 0, 1).factor_at(1.0) == 2.0
    path.write_text("time_s,worker,factor\n0,0,3.5\n")
    os.utime(path, ns=(1, 1))  # (another modification time, whatever the clock's grain)
    assert TraceSlowdown(path, 0, 1).factor_at(1.0) == 3.5
    assert compute.read_trace(path, 1) == {0: [(0.0, 3.5)]}


def test_a_kept_trace_still_refuses_a_worker_the_run_lacks_naming_its_line(
        tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,factor\n0,0,2\n# a comment\n5,3,1.5\n")
    assert compute.read_trace(path) == {0: [(0.0, 2.0)], 3: [(5.0, 1.5)]}  # (now kept)
    with pytest.raises(compute.TraceError, match=r"trace\.csv:4: unknown worker 3"):
        compute.read_trace(path, 2)
    assert TraceSlowdown(path, 3, 4).factor_at(5.0) == 1.5
