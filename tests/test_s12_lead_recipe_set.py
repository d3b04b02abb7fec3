"""A partition key that no run reads, given on the command line, names the ``--set`` that
wrote it: the recipe file has no such key, so the error must say where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """name = "t"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 1
[[runs]]
name = "a"
protocol = "bsp"
"""


def test_an_unread_partition_key_from_set_names_the_set(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    with pytest.raises(ConfigError, match=r"defaults\.data\.alpha: no run's partition reads "
                                          r"it; leave this key out; set by --set "
                                          r"data\.alpha=0\.5$"):
        load_recipe(recipe, overrides=["data.alpha=0.5"])
