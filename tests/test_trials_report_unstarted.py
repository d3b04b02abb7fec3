"""`asyncsync report` on a local study cut short before all its runs started: the runs
that have no folder yet are named with the unfinished ones, not silently left out."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_report import fake_run
from tests.test_report_unfinished import RESUME, flat, running, study_recipe


def test_runs_that_never_started_are_named(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    """A study interrupted (or still running) with --jobs: bsp finished, asp was cut, ssp
    and local_sgd never got a folder. The table has bsp only, and the note counts all
    four runs the study's recipe.json lists, as --resume would run them."""
    study = study_recipe(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.3, 0.6]).parent,
                         "bsp", "asp", "ssp", "local_sgd")
    running(tmp_path, "asp", "asp", [0.1, 0.4])
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert ("3 of 4 runs have no summary.json yet (not started, still running, or killed): "
            f"asp, ssp, local_sgd; {RESUME} {study} runs them") in flat(out)
    assert [r["run"] for r in csv.DictReader((study / "table.csv").open())] == ["bsp"]


def test_repeats_that_never_started_are_named(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """With repeats the study's folders are ``<run>-r<k>``: the missing ones are named so."""
    study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6], repeat=0).parent
    (study / "recipe.json").write_text(json.dumps(
        {"name": "r", "baseline": "bsp", "repeats": 2,
         "runs": [{"name": "bsp", "protocol": {"name": "bsp"}}]}))
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert ("1 of 2 runs has no summary.json yet (not started, still running, or killed): "
            f"bsp-r1; {RESUME} {study} runs them") in flat(out)


def test_one_run_folder_is_not_compared_with_its_study(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Reporting one run folder on purpose says nothing of the study's other runs."""
    done = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    study_recipe(done.parent, "bsp", "asp")
    code, out = run_main(capsys, "report", str(done))
    assert code == 0, out
    assert "no summary.json" not in out


def test_a_study_none_of_whose_runs_started_is_one_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Interrupted while its first runs were starting: one was cut, the rest never began."""
    cut = running(tmp_path, "bsp", "bsp", [0.1])
    (cut / "summary.json").write_text(json.dumps({"run": "bsp", "interrupted": True,
                                                 "error": "interrupted (Ctrl-C)"}))
    study = study_recipe(cut.parent, "bsp", "asp")
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; {cut}: left out, it was interrupted "
        "(Ctrl-C); 1 of 2 runs has no summary.json yet (not started, still running, or "
        f"killed): asp; {RESUME} {study} runs them")
