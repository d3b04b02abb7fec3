"""A trace that cannot be read says where a relative path was looked for: a recipe's trace
paths are read from the working directory, not from the recipe's folder, and a newcomer
running a recipe from elsewhere got only "cannot read trace recipes/traces/x.csv"."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
[defaults]
workers = 2
clock = "virtual"
{table}
[[runs]]
name = "a"
protocol = "asp"
"""


@pytest.mark.parametrize("table", [
    '[defaults.compute]\nprofile = { name = "trace", path = "traces/slow.csv" }',
    '[defaults.availability]\ntrace = "traces/online.csv"',
    '[defaults.capacity]\ntrace = "traces/devices.csv"',
])
def test_a_relative_trace_that_is_missing_names_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str) -> None:
    recipe = tmp_path / "recipes" / "r.toml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE.format(table=table))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ConfigError, match=rf"cannot read: .*\(looked for in {elsewhere}\)"):
        load_recipe(recipe)


def test_an_absolute_trace_that_is_missing_is_named_as_given(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    missing = tmp_path / "none.csv"
    recipe.write_text(RECIPE.format(table=f'[defaults.availability]\ntrace = "{missing}"'))
    with pytest.raises(ConfigError, match=rf"{missing}: cannot read: [^(]*$"):
        load_recipe(recipe)
