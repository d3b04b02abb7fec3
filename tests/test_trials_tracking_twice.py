"""One tracker named twice (``--track`` given twice, or beside the recipe's own
``[tracking]`` table, which `run` streams too) tracks each run once."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync import cli
from tests.test_tracking import RECIPE, scalars, study

__all__ = ["study"]  # the 2 x 2 study, a module fixture of test_tracking


def test_specs_naming_one_place_are_one() -> None:
    from asyncsync.tracking.spec import unique_specs

    assert unique_specs(["tensorboard=tb", "TensorBoard=tb/", "tensorboard", "tensorboard=runs",
                         "wandb", "wandb=asyncsync", "mlflow=x"]) == [
        "tensorboard=tb", "tensorboard", "wandb", "mlflow=x"]


def test_report_with_one_tracker_twice(study: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """It stopped at the first run: the second TensorBoard writer cleared the folder the
    first had open (error: b'.../events.out.tfevents...': No such file or directory)."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    spec = f"tensorboard={tmp_path / 'tb'}"
    code = cli.main(["report", str(study), "--track", spec, "--track", spec])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"tracked 4 runs: {spec}" in out
    folders = sorted((tmp_path / "tb").rglob("r[01]"))
    assert len(folders) == 4
    for folder in folders:
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        assert scalars(folder, "accuracy")


def test_run_with_the_recipes_tracker_given_again(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    recipe = tmp_path / "trk.toml"
    recipe.write_text(RECIPE.replace('name = "trk"',
                                     f'name = "trk"\n[tracking]\ntensorboard = "{tmp_path}/tb"'))
    assert cli.main(["run", str(recipe), "--only", "asp", "--plain", "--jobs", "1", "--logs",
                     str(tmp_path / "logs"), "--track", f"tensorboard={tmp_path / 'tb'}"]) == 0
    (folder,) = (tmp_path / "tb").rglob("r0")
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    assert scalars(folder, "accuracy")
