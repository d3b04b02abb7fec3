"""``asyncsync report`` of studies whose runs all failed: the exit status says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import prepare_folder
from asyncsync.study.study_folder import claimed
from tests.test_cli import one_error, run_main
from tests.test_parallel import recipe


def failed_study(tmp_path: Path, failed: tuple[str, ...] = ("bsp-r0", "bsp-r1", "asp-r0",
                                                           "asp-r1")) -> Path:
    """tests.test_parallel's study, prepared, its runs in `failed` failed before they
    logged anything (the others unstarted)."""
    resolved = load_recipe(recipe(tmp_path))
    study = tmp_path / "logs" / "small" / "20260101-000000"
    study.mkdir(parents=True)
    (study / "recipe.json").write_text(json.dumps(resolved.as_table()))
    for spec in resolved.runs:
        for repeat, one in enumerate(resolved.repeated(spec)):
            name = f"{spec.name}-r{repeat}"
            prepare_folder(one, resolved, study / name, repeat)
            if name in failed:
                (study / name / "summary.json").write_text(json.dumps(
                    {"error": f"RuntimeError: boom in {name}"}))
    return study


def test_a_report_whose_every_run_failed_exits_1_and_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = run_main(capsys, "report", str(failed_study(tmp_path)))
    assert code == 1, out
    assert "Traceback" not in out
    assert "RuntimeError: boom in asp-r0" in out  # the table still shows the errors
    assert "every run of this report failed (4 of 4)" in " ".join(out.split()), out


@pytest.mark.parametrize(("options", "difference"), [
    (["--set", "stop.time_s=40"], "runs[0] (bsp).stop.time_s: 30.0 in the study, 40.0 now"),
    (["--only", "asp"], "runs: bsp, asp in the study, asp now"),
    (["--repeats", "3"], "repeats: 2 in the study, 3 now"),
])
def test_resume_with_another_recipe_names_what_differs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, options: list[str],
        difference: str) -> None:
    study = failed_study(tmp_path, failed=())
    before = sorted(p.relative_to(study) for p in study.rglob("*"))
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--resume",
                                 str(study), *options))
    assert message.startswith(f"error: --resume {study}: its recipe.json differs from small "
                              f"as resolved now ({difference}); "), message
    assert sorted(p.relative_to(study) for p in study.rglob("*")) == before


def test_resume_of_a_folder_that_is_not_a_study_says_so_plainly(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--resume",
                                 str(tmp_path)))
    assert message == f"error: --resume {tmp_path}: not a study folder (no recipe.json in it)"
    message = one_error(run_main(capsys, "run", recipe(tmp_path), "--plain", "--resume",
                                 str(tmp_path / "nowhere")))
    assert message == f"error: --resume {tmp_path / 'nowhere'}: no such folder"


def test_resume_says_which_failed_runs_it_keeps_and_how_to_run_them_again(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A failed run counts as done (its error is deterministic): the resume line says
    which ones it keeps, so that no one waits for them to run again."""
    study = failed_study(tmp_path)
    code, out = run_main(capsys, "run", recipe(tmp_path), "--plain", "--resume", str(study))
    assert code == 1, out
    assert (f"resuming {study}: 4 of 4 runs done, 0 to run; kept as failed: bsp-r0, "
            "bsp-r1, asp-r0, asp-r1 (delete a run's folder to run it again)") in " ".join(
                out.split()), out


def test_report_of_a_study_still_running_says_so_instead_of_offering_resume(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Its runs without summary.json are running, not to be resumed (which the running
    supervisor's lock would refuse anyway)."""
    study = failed_study(tmp_path, failed=("bsp-r0",))
    with claimed(study, resumed=False):  # as the supervisor running the study holds it
        code, out = run_main(capsys, "report", str(study))
    said = " ".join(out.split())
    assert code == 1, out  # its one finished run failed
    assert (f"3 of 4 runs have no summary.json yet: bsp-r1, asp-r0, asp-r1; the study is "
            f"still running (pid {os.getpid()} holds {study})") in said, out
    assert "--resume" not in said
    code, out = run_main(capsys, "report", str(study))  # once it is no longer held
    assert "asyncsync run RECIPE --resume" in " ".join(out.split()), out


@pytest.mark.parametrize("text", ["{bad", "[1, 2]", '{"runs": 3, "baseline": 4}'])
def test_a_damaged_study_recipe_is_named_and_its_runs_still_reported(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> None:
    """The study's recipe.json gives only the runs' order and the baseline: each run's
    folder has its own. Damaged, it was a traceback."""
    study = failed_study(tmp_path)
    (study / "recipe.json").write_text(text)
    code, out = run_main(capsys, "report", str(study))
    said = " ".join(out.split())
    assert "Traceback" not in out
    assert code == 1, out  # every run failed, as before
    assert f"{study / 'recipe.json'}: damaged (" in said, out
    assert "boom in asp-r0" in said and "boom in bsp-r0" in said


def test_report_of_a_study_none_of_whose_runs_started_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A study stopped before its first run made a folder (only its recipe.json): not
    "no run logs", but which runs are to come and how to run them."""
    study = failed_study(tmp_path)
    for run in ("bsp-r0", "bsp-r1", "asp-r0", "asp-r1"):
        for path in (study / run).iterdir():
            path.unlink()
        (study / run).rmdir()
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 4 of 4 runs have no summary.json yet "
        "(not started, still running, or killed): bsp-r0, bsp-r1, asp-r0, asp-r1; asyncsync "
        f"run RECIPE --resume {study} runs them")
