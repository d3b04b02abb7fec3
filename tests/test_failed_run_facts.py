"""A virtual run that fails still records which path its workers' math took.

summary.json of a failed run held its error but no ``worker_math``: whether the steps ran
batched or one by one (and why) is what one asks first of a run that failed mid-way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from asyncsync.study.executors import run_folder
from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder
from tests.test_failed_evaluation import FailsInEval

RECIPE = """
name = "fails"

[defaults]
workers = 2
clock = "virtual"
stop = {{ time_s = 4 }}
eval = {{ interval_s = 1 }}
compute = {{ base_step_s = 0.1, batched = "{batched}" }}
model = {{ name = "tests.test_failed_run_facts:scored_once" }}

[[runs]]
name = "asp"
protocol = "asp"
"""


def scored_once(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    features = 1
    for size in input_shape:
        features *= size
    return FailsInEval(features, num_classes)


@pytest.mark.parametrize(("batched", "path"), [("off", "one-by-one"), ("on", "batched")])
def test_a_failed_run_says_which_worker_math_ran(tmp_path: Path, batched: str,
                                                  path: str) -> None:
    (tmp_path / "fails.toml").write_text(RECIPE.format(batched=batched))
    study = load_recipe(tmp_path / "fails.toml")
    run_dir = tmp_path / "asp"
    prepare_folder(study.runs[0], study, run_dir, 0)
    assert not run_folder(str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "this model cannot be scored" in summary["error"]
    assert summary["worker_math"] == path
