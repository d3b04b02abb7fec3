"""The run's lifecycle: evaluations and the stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.runlog.schema import KEY
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.runner import run_recipe
from asyncsync.study.simulation import simulate

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


def _run(tmp_path: Path, lr: float, patience_s: float | None,
         target: float = 0.99) -> tuple[dict[str, Any], Any]:
    """The stop record and the summary of an asp run at `lr` (20 s budget)."""
    stop = f"\npatience_s = {patience_s}" if patience_s is not None else ""
    text = (RECIPE.replace("time_s = 5", "time_s = 20").replace("target_accuracy = 0.5",
                                                                f"target_accuracy = {target}")
            .replace("stop_at_target = true", "stop_at_target = true" + stop)
            + f"[defaults.optim]\nlr = {lr}\n")
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "life.toml"
    recipe.write_text(text)
    (summary,) = asyncio.run(run_recipe(load_recipe(recipe), tmp_path / "logs", live=False))
    (events,) = (tmp_path / "logs").glob("*/*/asp/events.jsonl")
    records = [json.loads(line) for line in events.open()]
    return next(r for r in records if r[KEY] == "stop"), summary


def test_a_run_whose_accuracy_stalls_gives_up_after_its_patience(tmp_path: Path) -> None:
    """lr 1e-6 leaves the model where it started: the accuracy never rises by 0.01, so the
    run ends one patience after its first evaluation (0 s), not at its 20 s budget."""
    stop, summary = _run(tmp_path, 1e-6, 3.0)
    assert stop["reason"] == "patience" and stop["t"] == 3.0
    assert summary["gave_up"] == "patience" and summary["time_to_target_s"] is None


def test_patience_leaves_a_learning_run_as_it_was(tmp_path: Path) -> None:
    """At lr 0.1 the accuracy keeps rising until the 0.9 target: the same run with and
    without patience ends there, at the same time, with the same evaluations."""
    stop, summary = _run(tmp_path / "patient", 0.1, 3.0, target=0.9)
    plain_stop, plain = _run(tmp_path / "plain", 0.1, None, target=0.9)
    assert summary["time_to_target_s"] is not None and "gave_up" not in summary
    assert stop == plain_stop and summary["evaluations"] == plain["evaluations"]


def test_a_patience_shorter_than_the_evaluation_interval_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "life.toml"
    recipe.write_text(RECIPE.replace("stop_at_target = true",
                                     "stop_at_target = true\npatience_s = 0.2"))
    with pytest.raises(ConfigError, match=r"stop\.patience_s: 0\.2 s is shorter than "
                                          r"eval\.interval_s \(0\.5 s\)"):
        load_recipe(recipe)
