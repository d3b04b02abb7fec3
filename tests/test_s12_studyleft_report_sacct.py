"""``report`` of a study submitted with ``--executor slurm --no-wait`` whose tasks ended
without a summary.json (killed for memory, past their time, a node lost): it asks sacct
for the array's tasks and names each one's state; it said only "not started, still
running, or killed". Tasks still queued are named so too, and the note says to wait."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder
from tests.test_cli import one_error, run_main
from tests.test_s12_study3_jobs_tracker import RECIPE

SACCT = """#!/bin/sh
# asked as: sacct -n -P -X -j 4242 -o JobID,State (anything else: no answer)
[ "$*" = "-n -P -X -j 4242 -o JobID,State" ] || exit 1
"""


def submitted_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sacct: str | None,
                    cluster: str = "slurm") -> Path:
    """A study as ``run --executor slurm --no-wait`` leaves it: its recipe, its two run
    folders prepared, its array recorded; and an sacct on the PATH that prints `sacct`."""
    (tmp_path / "small.toml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "small.toml")
    study = tmp_path / "logs" / "small" / "20261127-100000"
    study.mkdir(parents=True)
    (study / "recipe.json").write_text(json.dumps(recipe.as_table()))
    for repeat, run in enumerate(recipe.repeated(recipe.runs[0])):
        prepare_folder(run, recipe, study / f"bsp-r{repeat}", repeat)
    (study / "submitted.json").write_text(json.dumps(
        {"job_array": "4242", "cluster": cluster, "runs": ["bsp-r0", "bsp-r1"]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if sacct is not None:
        (bin_dir / "sacct").write_text(SACCT + "".join(f"echo '{line}'\n"
                                                        for line in sacct.splitlines()))
        (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    return study


def test_the_tasks_killed_are_named_with_their_state(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    study = submitted_study(tmp_path, monkeypatch,
                            "4242_0|OUT_OF_MEMORY\n4242_1|CANCELLED by 1000")
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 2 of 2 runs have no summary.json yet: "
        "bsp-r0 (Slurm task 4242_0: OUT_OF_MEMORY), bsp-r1 (Slurm task 4242_1: CANCELLED "
        f"by 1000); task logs: {study / '.submitit'}; asyncsync run RECIPE --resume {study} "
        "runs them")


def test_tasks_still_queued_are_waited_for(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    """sacct folds the tasks not started into one line (``4242_[0-1%4]``, %: the array's
    throttle); --resume would be refused while they are queued."""
    study = submitted_study(tmp_path, monkeypatch, "4242_[0-1%4]|PENDING")
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 2 of 2 runs have no summary.json yet: "
        "bsp-r0 (Slurm task 4242_0: PENDING), bsp-r1 (Slurm task 4242_1: PENDING); task "
        f"logs: {study / '.submitit'}; report again once these tasks have ended")


@pytest.mark.parametrize(("sacct", "cluster"), [
    (None, "slurm"),  # no sacct on the PATH
    ("", "slurm"),  # accounting forgot the job: no line
    ("4242_0|OUT_OF_MEMORY", "local"),  # submitit ran the tasks here: not Slurm's jobs
])
def test_without_an_answer_the_note_is_as_before(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, sacct: str | None, cluster: str) -> None:
    study = submitted_study(tmp_path, monkeypatch, sacct, cluster)
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 2 of 2 runs have no summary.json yet "
        "(not started, still running, or killed): bsp-r0, bsp-r1; asyncsync run RECIPE "
        f"--resume {study} runs them")


def test_one_task_known_one_not(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    study = submitted_study(tmp_path, monkeypatch, "4242_1|TIMEOUT")
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 2 of 2 runs have no summary.json yet "
        "(not started, still running, or killed): bsp-r0, bsp-r1 (Slurm task 4242_1: "
        f"TIMEOUT); task logs: {study / '.submitit'}; asyncsync run RECIPE --resume "
        f"{study} runs them")
