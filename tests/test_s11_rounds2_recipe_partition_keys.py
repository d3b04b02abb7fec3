"""A partition key that the run's own partition does not read is refused by key, naming the
recipe file, where the run or the sweep sets it; one in [defaults.data] is refused when no
run's partition reads it, and kept when some run's does (a shared default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

HEAD = """name = "t"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 1
"""
RUN = '[[runs]]\nname = "a"\nprotocol = "bsp"\n'


@pytest.mark.parametrize(("body", "refused"), [
    (RUN + 'data = { partition = "iid", alpha = 0.1 }\n',
     r"runs\[0\] \(a\)\.data\.alpha: not read by partition 'iid'"),
    ("[defaults.data]\nsigma = 0.1\n" + RUN + 'data = { partition = "dirichlet" }\n',
     r"defaults\.data\.sigma: no run's partition reads it"),
    (RUN + '[sweep]\n"data.classes_per_worker" = [1, 2]\n',
     r"sweep\.data\.classes_per_worker: not read by partition 'iid'"),
])
def test_an_unread_partition_key_is_refused_naming_file_and_key(
        tmp_path: Path, body: str, refused: str) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(HEAD + body)
    with pytest.raises(ConfigError, match=rf"r\.toml: {refused}"):
        load_recipe(recipe)


def test_a_default_key_read_by_one_runs_partition_serves_it(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(HEAD + '[defaults.data]\npartition = "dirichlet"\nalpha = 0.1\n' + RUN
                      + '[[runs]]\nname = "b"\nprotocol = "bsp"\ndata = { partition = "iid" }\n')
    runs = load_recipe(recipe).runs
    assert [(r.data.partition, r.data.alpha) for r in runs] == [("dirichlet", 0.1),
                                                               ("iid", 0.1)]
