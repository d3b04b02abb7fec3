"""The run's lifecycle: evaluations and the stop."""

from __future__ import annotations

import json
from pathlib import Path

from asyncsync.logschema import KEY
from asyncsync.recipe import load_recipe
from asyncsync.simulation import simulate

RECIPE = """
name = "life"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "mlp"
[defaults.stop]
time_s = 5
target_accuracy = 0.5
stop_at_target = true
[defaults.eval]
interval_s = 0.5
[defaults.compute]
base_step_s = 0.01
[[runs]]
name = "asp"
protocol = "asp"
"""


def test_a_run_stopped_at_its_target_evaluates_that_model_once(tmp_path: Path) -> None:
    recipe = tmp_path / "life.toml"
    recipe.write_text(RECIPE)
    facts = simulate(load_recipe(recipe).run("asp"), tmp_path, "life/asp")
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").open()]
    evals = [r for r in records if r[KEY] == "eval"]
    stop = next(r for r in records if r[KEY] == "stop")
    assert evals[-1]["accuracy"] >= 0.5 and stop["t"] < 5
    versions = [e["version"] for e in evals]
    assert len(versions) == len(set(versions)), versions
    assert facts["clock"] == "virtual"
