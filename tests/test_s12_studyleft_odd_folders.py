"""``asyncsync report`` on the folders a user may give it: each gives a table or one
``error:`` line naming the path. A folder of run folders that is no study (copied out of
one: no study recipe.json) no longer ends its note with ``--resume`` of that folder, which
--resume refuses ("not a study folder")."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_report import fake_run
from tests.test_s12_study3_jobs_tracker import RECIPE


def table(path: Path) -> list[str]:
    """The runs of a table.csv, in its order, each as recipe/run."""
    with path.open() as rows:
        return [f"{row['recipe']}/{row['run']}" for row in csv.DictReader(rows)]


def test_a_folder_of_copied_runs_is_not_offered_to_resume(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6]).parent
    copied = tmp_path / "copied"
    shutil.copytree(study, copied)  # no study recipe.json: fake_run writes none
    (copied / "bsp" / "summary.json").unlink()
    assert one_error(run_main(capsys, "report", str(copied))) == (
        f"error: {copied}: no finished run to report; 1 of 1 runs has no summary.json yet "
        "(not started, still running, or killed): bsp")
    (tmp_path / "r.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "r.toml"), "--resume", str(copied))
    assert code == 2 and "not a study folder" in out, out  # what the hint led to


def test_a_path_that_is_not_there_or_a_file_is_one_error_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    missing = tmp_path / "nowhere"
    assert one_error(run_main(capsys, "report", str(missing))) == (
        f"error: {missing}: no such directory")
    file = run_dir / "events.jsonl"
    assert one_error(run_main(capsys, "report", str(file))).startswith(
        f"error: {file}: is a file, not a folder: report takes a log folder")
    (tmp_path / "empty").mkdir()
    assert one_error(run_main(capsys, "report", str(tmp_path / "empty"))) == (
        f"error: {tmp_path / 'empty'}: no run logs (directories with recipe.json and "
        "events.jsonl) under it")


def test_a_run_folder_one_run_two_recipes_and_an_old_layout_are_tabled(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A run's own folder is its one-row table, written beside it (not over the study's
    table.csv); two recipes' studies pool, each row named by its recipe; runs whose workers'
    logs have the schema of before asyncsync.runlog.schema (`old`) are read as of now."""
    bsp = fake_run(tmp_path, "a", "bsp", "bsp", [0.1, 0.6])
    fake_run(tmp_path, "a", "asp", "asp", [0.5, 0.7])
    fake_run(tmp_path, "b", "ssp", "ssp", [0.2, 0.6], old=True)
    code, out = run_main(capsys, "report", str(bsp))
    assert code == 0, out
    assert table(bsp / "table.csv") == ["a/bsp"]
    assert not (bsp.parent / "table.csv").exists()
    code, out = run_main(capsys, "report", str(tmp_path), "--out", str(tmp_path / "out"))
    assert code == 0, out
    # without a study recipe.json (fake_run writes none), a study's runs go in name order
    assert table(tmp_path / "out" / "table.csv") == ["a/asp", "a/bsp", "b/ssp"]
    assert [line.split()[0] for line in out.splitlines() if line.startswith(" a/")
            or line.startswith(" b/")] == ["a/asp", "a/bsp", "b/ssp"], out
    code, out = run_main(capsys, "report", str(tmp_path / "b"))
    assert code == 0, out
    assert table(tmp_path / "b" / "20260101-000000" / "table.csv") == ["b/ssp"]
