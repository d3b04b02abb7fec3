"""``--resume`` given a run's folder instead of its study's says which folder to give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder
from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe


def test_resume_with_a_run_folder_names_its_study(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    path = recipe(tmp_path)
    study = tmp_path / "logs" / "small" / "20260101-000000"
    study.mkdir(parents=True)
    resolved = load_recipe(path)
    (study / "recipe.json").write_text(json.dumps(resolved.as_table()))
    prepare_folder(resolved.runs[0], resolved, study / "bsp-r0", 0)
    assert one_error(run_main(capsys, "run", path, "--plain", "--resume",
                              str(study / "bsp-r0"))) == (
        f"error: --resume {study / 'bsp-r0'}: a run's folder; --resume takes its study's "
        f"folder: --resume {study}")
