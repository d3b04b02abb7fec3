"""A sweep's dotted key as TOML reads it unquoted (``optim.lr = [...]`` is a nested
table), and a sweep of several keys (a grid), which a recipe does not offer."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from tests.test_recipe import BASE, write


def test_an_unquoted_dotted_key_sweeps_as_the_quoted_one(tmp_path: Path) -> None:
    quoted = load_recipe(write(tmp_path, BASE + '[sweep]\n"optim.lr" = [0.1, 0.2]\n'))
    bare = load_recipe(write(tmp_path, BASE + "[sweep]\noptim.lr = [0.1, 0.2]\n"))
    table = load_recipe(write(tmp_path, BASE + "[sweep.optim]\nlr = [0.1, 0.2]\n"))
    assert [r.name for r in bare.runs] == [r.name for r in quoted.runs] == [
        "a@optim.lr=0.1", "b@optim.lr=0.1", "a@optim.lr=0.2", "b@optim.lr=0.2"]
    assert bare.as_table() == quoted.as_table() == table.as_table()
    assert [r.optim.lr for r in bare.runs] == [0.1, 0.1, 0.2, 0.2]


@pytest.mark.parametrize("sweep", ['workers = [2, 3]\n"optim.lr" = [0.1, 0.2]\n',
                                   "optim.lr = [0.1, 0.2]\noptim.momentum = [0.0, 0.9]\n"])
def test_a_grid_of_several_keys_is_refused_by_name(tmp_path: Path, sweep: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, BASE + "[sweep]\n" + sweep))
    assert "sweep: one key at a time, got " in str(err.value)
    assert "a grid of several keys is not offered" in str(err.value)
