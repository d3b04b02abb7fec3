"""Watching a virtual run does not change it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

RECIPE = """
name = "watched"
[defaults]
workers = 4
clock = "virtual"
[defaults.model]
name = "mlp"
[defaults.stop]
time_s = 4
[defaults.eval]
interval_s = 2
[defaults.compute]
base_step_s = 0.02
slowdown = [1, 1, 1, 3]
[[runs]]
name = "asp"
protocol = "asp"
"""


def test_a_status_sink_leaves_the_logs_byte_identical(tmp_path: Path) -> None:
    recipe = tmp_path / "watched.toml"
    recipe.write_text(RECIPE)
    spec = load_recipe(recipe).run("asp")
    seen: list[dict[str, Any]] = []
    plain, watched = tmp_path / "plain", tmp_path / "watched"
    plain.mkdir()
    watched.mkdir()
    simulate(spec, plain, "watched/asp")
    simulate(spec, watched, "watched/asp", seen.append)
    assert len(seen) >= 2 and seen[-1]["version"] > 0
    # (A watcher task sleeping on the loop reordered equal-time pushes: same versions,
    # other models, other accuracies.)
    for name in ("events.jsonl", "worker-0.jsonl", "worker-1.jsonl", "worker-2.jsonl",
                 "worker-3.jsonl"):
        assert (plain / name).read_bytes() == (watched / name).read_bytes(), name
