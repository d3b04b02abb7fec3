"""A tracker whose package is missing is named before anything runs: by `check` (which
said "ok" for a recipe whose [tracking] `run` then refused) and by `run`, each naming
where the tracker was asked for (the recipe's key, or the --track option)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe

TOOLS = [("mlflow", "mlflow"), ("wandb", "wandb"), ("tensorboard", "tensorboard")]


def tracked(tmp_path: Path, tool: str) -> str:
    """tests.test_parallel's recipe with a [tracking] table naming `tool`."""
    path = Path(recipe(tmp_path))
    path.write_text(path.read_text() + f'\n[tracking]\n{tool} = "{tmp_path / "tracked"}"\n')
    return str(path)


@pytest.mark.parametrize(("tool", "package"), TOOLS)
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_recipes_tracker_without_its_package_is_named_before_anything_runs(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, tool: str, package: str, command: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # not installed, as far as imports go
    path, logs = tracked(tmp_path, tool), tmp_path / "logs"
    extra = ["--plain", "--logs", str(logs)] if command == "run" else []
    assert one_error(run_main(capsys, command, path, *extra)) == (
        f"error: {path}: tracking.{tool}: needs the {package} package: pip install "
        "asyncsync[track]")
    assert not logs.exists() and not (tmp_path / "tracked").exists()


@pytest.mark.parametrize(("tool", "package"), TOOLS)
def test_a_track_option_without_its_package_is_named_before_anything_runs(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, tool: str, package: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)
    logs = tmp_path / "logs"
    spec = f"{tool}={tmp_path / 'tracked'}"
    assert one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--logs",
                              str(logs), "--track", spec)) == (
        f"error: --track {spec}: needs the {package} package: pip install asyncsync[track]")
    assert not logs.exists() and not (tmp_path / "tracked").exists()


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_a_tensorboard_folder_that_cannot_be_made_is_named_before_anything_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str) -> None:
    """It was found by the first run's tracker, after the study's folder was made, and
    said as "log() or finish() before start()"."""
    (tmp_path / "a-file").write_text("")
    logs, folder = tmp_path / "logs", tmp_path / where
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--logs",
                                 str(logs), "--track", f"tensorboard={folder}"))
    problem = "a file, not a folder" if where == "a-file" else "Not a directory"
    assert message == (f"error: tracking to tensorboard: cannot make the folder {folder} "
                       f"({problem})"), message
    assert not logs.exists()
