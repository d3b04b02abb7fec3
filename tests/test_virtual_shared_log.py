"""Virtual runs of many workers write one workers.jsonl, and every reader sees the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.results.report import summarize_run
from asyncsync.results.timeline import plot_timeline
from asyncsync.runlog.reading import read_jsonl, worker_logs
from asyncsync.runlog.schema import KEY, RANK, WORKERS_LOG, Kind
from asyncsync.study import simulation
from asyncsync.study.recipe import load_recipe
from asyncsync.tracking.base import Point, RunInfo
from asyncsync.tracking.feed import RunFeed

WORKERS = simulation.SHARED_LOG_ABOVE + 1
RECIPE = f"""
name = "shared"
[defaults]
workers = {WORKERS}
clock = "virtual"
[defaults.stop]
time_s = 0.6
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 0.2
[defaults.compute]
base_step_s = 0.05
slowdown = {[1, 2] * (WORKERS // 2) + [1]}
[defaults.network]
bandwidth_mbps = 100
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "asp"
protocol = "asp"
"""


class Points:
    """A tracker that keeps the points it is sent."""

    def __init__(self) -> None:
        self.points: list[Point] = []

    def start(self, run: RunInfo) -> None:
        del run

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        self.points.append(point)

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        del run, summary, step

    def close(self) -> None:
        """Nothing to release."""


def simulate(tmp_path: Path, name: str) -> Path:
    recipe = tmp_path / "shared.toml"
    recipe.write_text(RECIPE)
    spec = load_recipe(recipe).run("asp")
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "shared", "baseline": "asp", "runs": [spec.as_table()]}))
    simulation.simulate(spec, run_dir, "shared/asp")
    return run_dir


def test_many_workers_share_one_log_that_reads_as_their_own_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = simulate(tmp_path, "shared")
    with monkeypatch.context() as files:
        files.setattr(simulation, "SHARED_LOG_ABOVE", WORKERS)
        separate = simulate(tmp_path, "separate")
    assert sorted(p.name for p in shared.iterdir()) == [
        "events.jsonl", "recipe.json", WORKERS_LOG]
    assert len(list(separate.glob("worker-*.jsonl"))) == WORKERS
    assert (shared / "events.jsonl").read_bytes() == (separate / "events.jsonl").read_bytes()
    ranks = {r[RANK] for r in read_jsonl(shared / WORKERS_LOG)}
    assert ranks == set(range(WORKERS))
    logs = worker_logs(shared)
    assert logs == worker_logs(separate) and list(logs) == list(range(WORKERS))
    assert all(records[-1][KEY] == Kind.LEAVE for records in logs.values())
    assert summarize_run(shared) == summarize_run(separate)
    feeds: list[list[Any]] = []
    for run_dir in (shared, separate):
        tracker = Points()
        RunFeed(run_dir, [tracker]).finish()
        feeds.append([(p.step, p.time_s, p.metrics) for p in tracker.points])
    assert feeds[0] == feeds[1] and feeds[0]
    assert any(key.startswith("compute_proportion/w64") for key in feeds[0][-1][2])
    assert plot_timeline(shared, tmp_path / "t.png", "asp").exists()
