"""``--set`` and ``[sweep]`` as a new user types them: a value no run would see is refused,
and a malformed one is named with its real problem."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe

RECIPE = """
[defaults]
workers = 2
[defaults.stop]
time_s = 2
[defaults.compute]
profile = { name = "periodic", worker = 1, factor = 4, duration_s = 0.5, period_s = 1 }
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "ssp"
protocol = { name = "ssp", staleness = 3 }
"""


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    return path


def test_a_key_inside_a_protocol_every_run_names_is_refused(recipe: Path) -> None:
    """The runs' own protocols (a name, or a table with a name) replace the default one
    whole: ``protocol.staleness`` from --set would reach none of them."""
    with pytest.raises(ConfigError, match=r"--set protocol.staleness=5: every run sets "
                       r"protocol itself, so it would be ignored"):
        load_recipe(recipe, ["protocol.staleness=5"])


def test_a_sweep_inside_a_protocol_every_run_names_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\n"protocol.staleness" = [1, 2]\n' + RECIPE)
    with pytest.raises(ConfigError, match=r"sweep.protocol.staleness: every run sets "
                       r"protocol itself, so the sweep would change nothing"):
        load_recipe(path)


def test_a_key_of_a_named_default_table_still_reaches_the_runs(recipe: Path) -> None:
    """Only a run's own named table replaces the default; here no run sets a profile."""
    runs = load_recipe(recipe, ["compute.profile.factor=8"]).runs
    assert [r.compute.profile["factor"] for r in runs] == [8, 8]


def test_a_key_under_a_list_names_its_whole_path(recipe: Path) -> None:
    with pytest.raises(ConfigError, match=r"--set compute.profile.factor.x: "
                       r"defaults.compute.profile.factor is not a table$"):
        load_recipe(recipe, ["compute.profile.factor.x=1"])


@pytest.mark.parametrize("text", ['protocol={name=ssp, staleness=3}', "compute.slowdown=[1, 3",
                                  'data.name="mnist'])
def test_a_value_that_is_no_toml_says_so(recipe: Path, text: str) -> None:
    """A bracket, brace or quote starts a TOML value: one that does not parse is named as
    such, not taken as a bare string and refused for being no protocol or list."""
    with pytest.raises(ConfigError, match=rf"--set {re.escape(text)}: not a TOML value "
                       r"\(.*\); a string inside a list or table needs quotes"):
        load_recipe(recipe, [text])


def test_a_bare_word_is_still_a_string(recipe: Path) -> None:
    runs = load_recipe(recipe, ["data.name=synthetic", "model.name=mlp"]).runs
    assert runs[0].data.name == "synthetic" and runs[0].model.name == "mlp"


@pytest.mark.parametrize("name", ["..", ".", "a/b", ""])
def test_a_recipe_name_that_is_no_folder_name_is_refused(tmp_path: Path, name: str) -> None:
    """The name is the study's folder under the log root: ``..`` would put the study beside
    the log root, ``a/b`` a folder that report takes for a recipe of its own."""
    path = tmp_path / "named.toml"
    path.write_text(f'name = "{name}"\n' + RECIPE)
    with pytest.raises(ConfigError, match=r"named.toml: name: must be a non-empty name "
                       r"without '/' \(it names the recipe's log directory\), got"):
        load_recipe(path)
