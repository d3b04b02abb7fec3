"""`asyncsync report` on a study whose runs are not all finished (a Slurm array still
queued or running, a local study in progress or killed): only finished runs are tabled."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.executors import failure, write_summary
from tests.test_cli import one_error, run_main, with_settings
from tests.test_report import fake_run

RESUME = "asyncsync run RECIPE --resume"


def running(root: Path, name: str, protocol: str, accuracies: list[float]) -> Path:
    """A run still going (or killed): its logs so far, no stop record, no workers' final
    records, no summary.json."""
    run_dir = fake_run(root, "r", name, protocol, accuracies)
    (run_dir / "summary.json").unlink()
    for log in [run_dir / "events.jsonl", *run_dir.glob("worker-*.jsonl")]:
        kept = [r for r in read_jsonl(log) if r.get(KEY) not in (Kind.STOP, Kind.FINAL)]
        log.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return run_dir


def queued(root: Path, name: str, protocol: str) -> Path:
    """A run prepared but not started (a Slurm task still queued): its recipe.json only."""
    run_dir = fake_run(root, "r", name, protocol, [])
    for log in [*run_dir.glob("*.jsonl"), run_dir / "summary.json"]:
        log.unlink()
    return run_dir


def study_recipe(study: Path, *names: str) -> Path:
    """The whole recipe the runner writes into a study folder before any run."""
    (study / "recipe.json").write_text(json.dumps(
        {"name": "r", "baseline": "bsp", "repeats": 1,
         "runs": [{"name": n, "protocol": {"name": n}} for n in names]}))
    return study


def flat(out: str) -> str:
    return " ".join(out.split())


def table_rows(out: str) -> list[str]:
    """The first cell of each line: the run names the table shows."""
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_a_study_tables_only_its_finished_runs(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """asp stopped half-way (0.4 so far, no workers' totals): tabled from its partial logs it
    would show a best accuracy, a compute proportion and a speedup it never measured."""
    study = study_recipe(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.3, 0.6]).parent,
                         "bsp", "asp", "ssp")
    running(tmp_path, "asp", "asp", [0.1, 0.4])
    queued(tmp_path, "ssp", "ssp")
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert ("2 of 3 runs have no summary.json yet (not started, still running, or killed): "
            f"asp, ssp; {RESUME} {study} runs them") in flat(out)
    assert "bsp" in table_rows(out)
    assert "asp" not in table_rows(out) and "ssp" not in table_rows(out)
    rows = list(csv.DictReader((study / "table.csv").open()))
    assert [r["run"] for r in rows] == ["bsp"]
    assert not (study / "timeline-asp.png").exists()


@pytest.mark.parametrize("started", [False, True], ids=["just-submitted", "killed"])
def test_a_study_with_no_finished_run_is_one_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, started: bool) -> None:
    """Right after ``asyncsync run --executor slurm --no-wait`` (every folder prepared,
    none started), or a study killed before any run finished."""
    bsp = queued(tmp_path, "bsp", "bsp")
    asp = running(tmp_path, "asp", "asp", [0.1, 0.4]) if started else queued(
        tmp_path, "asp", "asp")
    study = study_recipe(bsp.parent, "bsp", "asp")
    assert asp.parent == study
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 2 of 2 runs have no summary.json yet "
        f"(not started, still running, or killed): bsp, asp; {RESUME} {study} runs them")
    assert not (study / "table.csv").exists()


def test_one_run_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A finished run folder is tabled on its own; an unfinished one is an error."""
    done = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    cut = running(tmp_path, "asp", "asp", [0.1, 0.4])
    study = study_recipe(done.parent, "bsp", "asp")
    code, out = run_main(capsys, "report", str(done))
    assert code == 0, out
    assert "bsp" in table_rows(out) and "no summary.json" not in out
    assert one_error(run_main(capsys, "report", str(cut))) == (
        f"error: {cut}: no finished run to report; 1 of 1 runs has no summary.json yet "
        f"(not started, still running, or killed): asp; {RESUME} {study} runs them")


def test_the_latest_study_is_reported_even_if_nothing_in_it_finished(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Not silently the previous study's table: the user asked about the one just
    submitted; --all tables the older one and says what the newer lacks."""
    old = study_recipe(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6]).parent, "bsp")
    new = old.rename(old.with_name("20260102-000000"))
    old = study_recipe(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6]).parent, "bsp")
    for run_dir in new.iterdir():
        if run_dir.is_dir():
            (run_dir / "summary.json").unlink()
            (run_dir / "events.jsonl").write_text("")
    assert one_error(run_main(capsys, "report", str(tmp_path / "r"))).startswith(
        f"error: {tmp_path / 'r'}: no finished run to report; {tmp_path / 'r'} holds 2 "
        f"studies: reporting the latest, {new}")
    code, out = run_main(capsys, "report", str(tmp_path / "r"), "--all")
    assert code == 0, out
    assert f"1 of 1 runs has no summary.json yet (not started, still running, or killed): " \
        f"bsp; {RESUME} {new} runs them" in flat(out)
    assert out.count("r: comparison (baseline bsp)") == 1
    assert (old / "table.csv").exists() and not (new / "table.csv").exists()


def test_interrupted_and_unfinished_runs_are_both_left_out(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An interrupted run (Ctrl-C: its summary.json says so) keeps its own note."""
    study = study_recipe(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6]).parent,
                         "bsp", "asp", "ssp")
    cut = running(tmp_path, "asp", "asp", [0.1])
    (cut / "summary.json").write_text(json.dumps({"run": "asp", "interrupted": True,
                                                 "error": "interrupted (Ctrl-C)"}))
    running(tmp_path, "ssp", "ssp", [0.1, 0.2])
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert f"{cut}: left out, it was interrupted (Ctrl-C)" in flat(out)
    assert ("1 of 3 runs has no summary.json yet (not started, still running, or killed): "
            f"ssp; {RESUME} {study} runs them") in flat(out)
    assert [r["run"] for r in csv.DictReader((study / "table.csv").open())] == ["bsp"]
    (study / "bsp" / "summary.json").write_text(json.dumps({
        "run": "bsp", "interrupted": True, "error": "interrupted (Ctrl-C)"}))
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; {study / 'bsp'}: left out, it was "
        f"interrupted (Ctrl-C); {cut}: left out, it was interrupted (Ctrl-C); 1 of 3 runs "
        "has no summary.json yet (not started, still running, or killed): ssp; "
        f"{RESUME} {study} runs them")


def test_logs_with_the_stop_record_but_no_summary_are_not_finished(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No summary.json is not finished, without exception: logs copied without it, or a
    run killed between the server's stop record and its summary, are not tabled."""
    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    (run_dir / "summary.json").unlink()
    assert any(e.get(KEY) == Kind.STOP for e in read_jsonl(run_dir / "events.jsonl"))
    study = study_recipe(run_dir.parent, "bsp")  # a study's folder: --resume takes it
    assert one_error(run_main(capsys, "report", str(study))) == (
        f"error: {study}: no finished run to report; 1 of 1 runs has no "
        f"summary.json yet (not started, still running, or killed): bsp; {RESUME} "
        f"{study} runs them")


@pytest.mark.parametrize("logged", [True, False], ids=["mid-run", "before-logging"])
def test_a_failed_run_is_shown_failed_as_run_shows_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, logged: bool) -> None:
    """asp raised (a worker's non-finite push): its summary.json holds the error, and its
    partial logs reach the target at 2 s. Report tables the error, as `asyncsync run` did,
    with no time to target, no speedup and no plots; also when it failed before logging."""
    bsp = with_settings(fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.3, 0.6]), time_s=10)
    study = study_recipe(bsp.parent, "bsp", "asp")
    asp = with_settings(fake_run(tmp_path, "r", "asp", "asp", [0.1, 0.6]), time_s=10)
    if not logged:
        for log in asp.glob("*.jsonl"):
            log.unlink()
    error = "worker 1: non-finite values (NaN or Inf) in the pushed tensor"
    write_summary(asp, failure(asp, error))
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert ["asp", "asp", "failed:", *error.split()] in [line.split() for line in
                                                          out.splitlines()]
    rows = {r["run"]: r for r in csv.DictReader((study / "table.csv").open())}
    assert rows["asp"]["error"] == error and rows["bsp"]["error"] == ""
    assert rows["asp"]["time_to_target_s"] == rows["asp"]["speedup"] == ""
    assert rows["bsp"]["time_to_target_s"] == "4.0"
    assert (study / "timeline-bsp.png").exists()
    assert not (study / "timeline-asp.png").exists()
