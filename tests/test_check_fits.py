"""`check` refuses settings that the run would refuse or ignore.

It refuses a protocol's parameters that do not fit the run's number of workers, as
the server would, for every protocol whose parameters say what fits (not only the round
protocols): wbsp's ``slow_worker = 3`` or lbbsp's ``global_batch = 2`` with 3 workers passed
`check`, and each run then failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
[defaults]
workers = 3
clock = "virtual"
[[runs]]
name = "a"
protocol = {{ {protocol} }}
"""


@pytest.mark.parametrize(("protocol", "message"), [
    ('name = "wbsp", slow_worker = 3', "slow_worker: must be a rank below 3"),
    ('name = "lbbsp", global_batch = 2', "global_batch: 2 samples cannot be split among 3"),
    ('name = "fedavg", fraction = 0.5, backup_workers = 2',
     "backup_workers: must be < the 2 workers a round samples"),
])
def test_parameters_that_do_not_fit_the_workers_are_refused_by_check(
        tmp_path: Path, protocol: str, message: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(protocol=protocol))
    with pytest.raises(ConfigError, match=rf"runs\[0\] \(a\): protocol\.{message}"):
        load_recipe(path)


def test_parameters_that_fit_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(protocol='name = "wbsp", slow_worker = 2'))
    assert load_recipe(path).runs[0].protocol.params.slow_worker == 2  # type: ignore[attr-defined]


def test_a_checkpoint_period_on_the_virtual_clock_is_refused(tmp_path: Path) -> None:
    """A virtual run takes no checkpoints; the key used to be taken and ignored."""
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(protocol='name = "bsp"'))
    with pytest.raises(ConfigError, match=r"fault\.checkpoint_s: a virtual run takes no "
                                          "checkpoints"):
        load_recipe(path, ["fault.checkpoint_s=5"])
    assert load_recipe(path, ["fault.checkpoint_s=5", 'clock="real"']).runs[0].fault \
        .checkpoint_s == 5
