"""A virtual run that fails still records which path its workers' math took.

summary.json of a failed run held its error but no ``worker_math``: whether the steps ran
batched or one by one (and why) is what one asks first of a run that failed mid-way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from asyncsync.study.executors import run_folder
from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder

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


class _ScoredOnce(nn.Module):
    """A linear model that passes its check at build (one forward in eval mode), then
    raises whenever it is evaluated."""

    def __init__(self, features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, num_classes)
        self.scored = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            self.scored += 1
            if self.scored > 1:
                raise RuntimeError("this model cannot be scored")
        return self.linear(x.flatten(1))


def scored_once(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    features = 1
    for size in input_shape:
        features *= size
    return _ScoredOnce(features, num_classes)


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
