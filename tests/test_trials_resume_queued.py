"""``--resume`` of a Slurm study whose job array still has tasks queued or running is
refused: it would clear their folders and submit them a second time, two tasks then
writing one run's logs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from asyncsync.study.recipe import load_recipe
from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe

SQUEUE = """#!/bin/sh
# squeue -h -j 4242 -o %i: two tasks of the array still there
echo 4242_2
echo 4242_3
"""


def slurm_study(tmp_path: Path) -> tuple[str, Path]:
    path = recipe(tmp_path)
    study = tmp_path / "logs" / "small" / "20260101-000000"
    study.mkdir(parents=True)
    (study / "recipe.json").write_text(json.dumps(load_recipe(path).as_table()))
    (study / "submitted.json").write_text(json.dumps(
        {"job_array": "4242", "cluster": "slurm", "runs": ["bsp-r0", "bsp-r1", "asp-r0",
                                                          "asp-r1"]}))
    return path, study


def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(script)
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")


def test_resume_while_the_array_runs_is_refused(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    path, study = slurm_study(tmp_path)
    fake(tmp_path, monkeypatch, SQUEUE)
    assert one_error(run_main(capsys, "run", path, "--plain", "--executor", "slurm",
                              "--resume", str(study))) == (
        f"error: --resume {study}: its Slurm job array 4242 still has 2 tasks queued or "
        f"running (4242_2, 4242_3); resuming now would run them twice: wait for them "
        f"(asyncsync report {study} tables what is done), or cancel them first "
        "(scancel 4242)")
    assert not any(p.is_dir() for p in study.iterdir())  # nothing cleared or prepared


def test_an_array_squeue_no_longer_knows_does_not_stop_a_resume(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """squeue forgets finished jobs ("Invalid job id specified", exit 1): none is queued."""
    from asyncsync.study.executors import queued_tasks

    _, study = slurm_study(tmp_path)
    fake(tmp_path, monkeypatch, "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id "
                                "specified' >&2\nexit 1\n")
    assert queued_tasks(study) is None
