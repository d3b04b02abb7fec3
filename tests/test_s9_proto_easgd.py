"""Synchronous EASGD's bound ``N alpha <= 1`` is judged against the run's size by the
parameters' ``check_workers``, so that ``asyncsync check`` refuses it (naming the file, run
and key) instead of the run failing when its server starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.protocols.easgd import EasgdSyncParams
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
name = "easgd_alpha"
[defaults]
workers = 4
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 1
[defaults.compute]
base_step_s = 0.01
[[runs]]
name = "sync"
protocol = { name = "easgd", alpha = 0.3 }
[[runs]]
name = "async"
protocol = { name = "easgd_async", alpha = 0.3 }
"""


def test_n_alpha_above_one_is_refused_for_the_run_size() -> None:
    EasgdSyncParams(alpha=0.25).check_workers(4)  # N alpha = 1: the workers' mean
    EasgdSyncParams().check_workers(100)  # 0.9 / N
    with pytest.raises(ValueError, match=r"^alpha: N alpha = 4 x 0\.3 exceeds 1"):
        EasgdSyncParams(alpha=0.3).check_workers(4)


def test_a_recipe_check_refuses_it_for_easgd_only(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    with pytest.raises(ConfigError, match=r"runs\[0\] \(sync\): protocol\.alpha: N alpha = "
                                          r"4 x 0\.3 exceeds 1"):
        load_recipe(path)
    path.write_text(RECIPE.replace("alpha = 0.3 }\n[[runs]]", "alpha = 0.25 }\n[[runs]]"))
    assert [run.name for run in load_recipe(path).runs] == ["sync", "async"]
