"""A tracker fed a swept study written before the shell-safe sweep names (folders such as
``a@compute.slowdown=[1, 3]-r0``) is told the names written now, so that the study
exported before and after a ``--resume`` (which renames its folders) is one set of
tracked runs, and TensorBoard's folders are the ones a shell takes unquoted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study.runner import run_recipe_file
from asyncsync.tracking import Point, RunInfo, export_study

RECIPE = """
name = "swept"
[defaults]
workers = 2
clock = "virtual"
protocol = "bsp"
[defaults.stop]
time_s = 0.5
[defaults.model]
name = "mlp"
[defaults.data]
name = "synthetic"
[defaults.compute]
base_step_s = 0.05
[[runs]]
name = "a"
[sweep]
"compute.slowdown" = [[1, 3], [1, 2]]
"""

OLD_TO_NEW = {"a@compute.slowdown=[1, 3]": "a@compute.slowdown=1,3",
              "a@compute.slowdown=[1, 2]": "a@compute.slowdown=1,2"}
"""Each run's name before 2026-11-27 and now, written out by hand."""


class Started:
    """A tracker that keeps the runs it is told to start."""

    def __init__(self) -> None:
        self.runs: list[RunInfo] = []

    def start(self, run: RunInfo) -> None:
        self.runs.append(run)

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        """Evaluations are not this test's."""

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        """Summaries are not this test's."""

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A swept study with 2 repeats as written now, and a copy as written before."""
    root = tmp_path_factory.mktemp("swept")
    (root / "swept.toml").write_text(RECIPE)
    summaries = run_recipe_file(root / "swept.toml", [], [], root / "logs", live=False,
                                repeats=2)
    assert len(summaries) == 4 and not any("error" in s for s in summaries), summaries
    (study,) = (root / "logs" / "swept").iterdir()
    old = root / "old" / study.name
    shutil.copytree(study, old)
    new_to_old = {new: old_name for old_name, new in OLD_TO_NEW.items()}
    for run_dir in sorted(p for p in old.iterdir() if p.is_dir()):
        name, repeat = run_dir.name.rsplit("-", 1)
        _rewrite(run_dir / "recipe.json", lambda t: t["runs"][0], new_to_old[name])
        _rewrite(run_dir / "summary.json", lambda t: t, new_to_old[name], key="run")
        run_dir.rename(old / f"{new_to_old[name]}-{repeat}")
    table = json.loads((old / "recipe.json").read_text())
    for spec in table["runs"]:
        spec["name"] = new_to_old[spec["name"]]
    (old / "recipe.json").write_text(json.dumps(table))
    return study, old


def _rewrite(path: Path, where: Any, name: str, key: str = "name") -> None:
    table = json.loads(path.read_text())
    where(table)[key] = name
    path.write_text(json.dumps(table))


def test_an_old_study_is_tracked_under_the_names_of_now(studies: tuple[Path, Path]) -> None:
    study, old = studies
    assert (old / "a@compute.slowdown=[1, 3]-r1" / "events.jsonl").is_file()
    now, before = Started(), Started()
    export_study(study, [now])
    export_study(old, [before])
    expected = sorted(f"swept/{study.name}/{new}-r{r}" for new in OLD_TO_NEW.values()
                      for r in (0, 1))
    assert sorted(run.run_id for run in now.runs) == expected
    assert sorted(run.run_id for run in before.runs) == expected
    assert sorted(run.name for run in before.runs) == sorted(2 * list(OLD_TO_NEW.values()))
    assert all(run.config["name"] == run.name for run in before.runs)
    assert all(run.group == f"swept/{study.name}/{run.name}" for run in before.runs)


def test_tensorboard_writes_an_old_study_into_the_folders_of_now(
        studies: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    from asyncsync.tracking.tensorboard_tracker import TensorBoardTracker

    study, old = studies
    export_study(old, [TensorBoardTracker(tmp_path / "tb")])
    written = sorted(p.relative_to(tmp_path / "tb" / "swept" / study.name).as_posix()
                     for p in (tmp_path / "tb" / "swept" / study.name).glob("*/r*"))
    assert written == sorted(f"{new}/r{r}" for new in OLD_TO_NEW.values() for r in (0, 1))
