"""Which runs a report tables and how it names them, from small study folders written here
(mutation testing of `asyncsync.results.studies`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsync.results import studies
from asyncsync.results.studies import LogError, resolved_run, slurm_states


def run_folder(path: Path, name: str = "bsp", repeat: int | None = None,
               **spec: Any) -> Path:
    """A run's folder with its resolved recipe.json and an events.jsonl."""
    path.mkdir(parents=True)
    run = {"name": name, "protocol": {"name": "bsp"}, "workers": 2, "stop": {}, **spec}
    table: dict[str, Any] = {"name": "r", "runs": [run]}
    if repeat is not None:
        table["repeat"] = repeat
    (path / "recipe.json").write_text(json.dumps(table))
    (path / "events.jsonl").write_text("")
    return path


def test_a_recipe_with_no_workers_is_not_a_run(tmp_path: Path) -> None:
    run_dir = run_folder(tmp_path / "bsp", workers=0)
    with pytest.raises(LogError, match=r"recipe\.json: TypeError: workers: expected an "
                                       r"integer >= 1, got 0"):
        resolved_run(run_dir)


def test_a_run_is_named_by_its_recipe_s_repeat_and_a_real_clock_by_default(
        tmp_path: Path) -> None:
    named = studies.identity(*resolved_run(run_folder(tmp_path / "bsp-r2", repeat=2)))
    assert (named["repeat"], named["clock"], named["seed"]) == (2, "real", 0)


def test_a_study_of_2_repeats_promises_two_folders_a_run(tmp_path: Path) -> None:
    (tmp_path / "recipe.json").write_text(json.dumps(
        {"repeats": 2, "runs": [{"name": "bsp"}, {"name": "asp"}]}))
    assert studies._study_folders(tmp_path) == ["bsp-r0", "bsp-r1", "asp-r0", "asp-r1"]


def test_runs_the_recipe_does_not_name_come_after_those_it_does(tmp_path: Path) -> None:
    study = tmp_path / "20260101-000000"
    run_folder(study / "zeta", "zeta")
    run_folder(study / "alpha", "alpha")
    run_folder(study / "asp", "asp")
    (study / "recipe.json").write_text(json.dumps({"runs": [{"name": "zeta"}, {"name": "asp"}]}))
    runs = sorted((study / name for name in ("alpha", "asp", "zeta")),
                  key=studies._recipe_order)
    assert [r.name for r in runs] == ["zeta", "asp", "alpha"]


def test_sacct_s_task_ranges_name_each_run(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / studies.SUBMITTED).write_text(json.dumps(
        {"job_array": "4242", "cluster": "slurm", "runs": ["a", "b", "c", "d"]}))
    sacct = tmp_path / "sacct"
    sacct.write_text("#!/bin/sh\necho '4242_1|OUT_OF_MEMORY'\necho '4242_[2-3%2]|PENDING'\n"
                     "echo '4242_4|PENDING'\necho '99_0|FAILED'\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{Path(sys.executable).parent}")
    assert slurm_states(tmp_path) == {"b": ("4242_1", "OUT_OF_MEMORY"),
                                      "c": ("4242_2", "PENDING"), "d": ("4242_3", "PENDING")}
    note = studies._unfinished(["a", "b", "c"], 4, tmp_path)
    assert note.endswith("report again once these tasks have ended")  # c is still queued


def test_an_old_sweep_folder_is_not_renamed_over_a_folder_of_its_new_name(
        tmp_path: Path) -> None:
    sweep = {"compute.slowdown": [1, 3]}
    old = "bsp@compute.slowdown=[1, 3]"
    (tmp_path / "recipe.json").write_text(json.dumps(
        {"runs": [{"name": old, "sweep": sweep}]}))
    run_folder(tmp_path / old, old, sweep=sweep)
    (tmp_path / "bsp@compute.slowdown=1,3").mkdir()
    with pytest.raises(LogError, match=r"cannot take its new name bsp@compute\.slowdown=1,3"):
        studies.upgrade_sweep_names(tmp_path)
    assert (tmp_path / old / "recipe.json").is_file()
