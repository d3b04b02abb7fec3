"""A page's `asyncsync simulate logs/RECIPE/STAMP/FOLDER` names a folder that recipe makes.

A run's folder is its run's name, with `-r<repeat>` when the recipe has repeats, and a swept
run's name carries `@key=value` (docs/results.md, "Sweeps"); a reader who copies the
example gets "not found" otherwise.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from asyncsync.study.recipe import load_recipe
from tests.doc_pages import ROOT, SHELLS, all_blocks

SIMULATE = re.compile(r"^asyncsync simulate (?P<path>\S+)")


def recipes_by_name() -> dict[str, Path]:
    """Each shipped recipe's `name` (its file's stem when it has none)."""
    names: dict[str, Path] = {}
    for path in sorted((ROOT / "recipes").rglob("*.toml")):
        names[load_recipe(path).name] = path
    return names


def folders(recipe: Path) -> set[str]:
    """The run folders a study of `recipe` writes, by the rule the results page states."""
    loaded = load_recipe(recipe)
    if loaded.repeats == 1:
        return {run.name for run in loaded.runs}
    return {f"{run.name}-r{k}" for run in loaded.runs for k in range(loaded.repeats)}


def simulate_paths() -> list[tuple[str, str]]:
    """(where, path) of every `asyncsync simulate` line of a shell block."""
    found = []
    for block in all_blocks():
        if block.lang not in SHELLS:
            continue
        for line in block.code.splitlines():
            match = SIMULATE.match(line.strip())
            if match:
                found.append((block.where, shlex.split(match["path"], comments=True)[0]))
    return found


def test_the_studies_page_shows_simulate() -> None:
    """The check below has something to check."""
    assert any(where.startswith("docs/studies.md") for where, _ in simulate_paths())


def test_every_simulate_example_names_a_folder_of_its_recipe() -> None:
    """logs/<recipe name>/<stamp>/<folder>: the folder is one the named recipe makes."""
    recipes = recipes_by_name()
    wrong = []
    for where, path in simulate_paths():
        parts = Path(path).parts
        assert len(parts) == 4 and parts[0] == "logs", f"{where}: {path}: not logs/R/STAMP/RUN"
        recipe = recipes.get(parts[1])
        assert recipe is not None, f"{where}: {path}: no shipped recipe is named {parts[1]!r}"
        if parts[3] not in folders(recipe):
            wrong.append(f"{where}: {parts[3]} is no run folder of {recipe.relative_to(ROOT)}")
    assert wrong == []


def test_folders_follow_the_stated_rule() -> None:
    """The rule on the quickstart (no repeats) and on a swept study with 5 repeats."""
    assert folders(ROOT / "recipes/quickstart.toml") == {"bsp", "asp"}
    wbsp = folders(ROOT / "recipes/at_scale/wbsp.toml")
    assert len(wbsp) == 60
    assert "bsp@compute.profile.seconds=0.5-r0" in wbsp and "bsp-r0" not in wbsp
