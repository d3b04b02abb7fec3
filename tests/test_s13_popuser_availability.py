"""Availability as a recipe writes it: a run's generator over a default trace is refused
with what was merged and how to mend it, and the mended recipe loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

HEAD = """name = "t"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 4
[defaults.availability]
trace = "{trace}"
[[runs]]
name = "exp"
protocol = "bsp"
"""


def _recipe(tmp_path: Path, run_table: str) -> Path:
    trace = tmp_path / "a.csv"
    trace.write_text("worker,online_from_s,online_to_s\n0,0,4\n1,0,4\n2,1,3\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text(HEAD.format(trace=trace) + f"availability = {run_table}\n")
    return recipe


def test_a_runs_generator_over_a_default_trace_says_what_was_merged(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, '{ generator = "exponential", mean_online_s = 2 }')
    with pytest.raises(ConfigError) as caught:
        load_recipe(recipe)
    message = str(caught.value)
    assert "r.toml" in message and "runs[0] (exp)" in message
    assert str(tmp_path / "a.csv") in message and "'exponential'" in message
    assert "[defaults.availability]" in message and 'trace = ""' in message


def test_the_mended_run_draws_from_its_generator(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, '{ trace = "", generator = "exponential", mean_online_s = 2 }')
    (run,) = load_recipe(recipe).runs
    assert run.availability.generator == "exponential" and run.availability.trace == ""
