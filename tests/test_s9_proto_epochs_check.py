"""``asyncsync check`` refuses FedAvg's ``local_epochs`` with the timing model up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
name = "epochs_timing"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 1
[defaults.compute]
base_step_s = 0.01
[[runs]]
name = "e1"
protocol = { name = "fedavg", local_epochs = 1 }
"""


def test_a_timing_run_with_local_epochs_is_refused_at_check_naming_file_and_key(
        tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    with pytest.raises(ConfigError, match=rf"{path}: runs\[0\] \(e1\): protocol\.local_epochs: "
                                          "the run's batches tell no shard size"):
        load_recipe(path)
    path.write_text(RECIPE.replace("local_epochs = 1", "local_steps = 4"))
    assert load_recipe(path).runs[0].protocol.params.local_steps == 4
