"""`asyncsync report` on damaged logs, failed runs' targets, and a file given as a folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync.errors import InputError
from asyncsync.results.report import publish
from asyncsync.runlog.reading import read_jsonl
from asyncsync.study.executors import failure, write_summary
from tests.test_cli import one_error, run_main, with_settings
from tests.test_report import fake_run
from tests.test_report_unfinished import flat, study_recipe

EVAL = '{"event": "eval", "t": 1.0, "accuracy": 0.5}\n'
STOP = '{"event": "stop", "t": 2.0}\n'


@pytest.mark.parametrize(("text", "problem"), [
    ("garbage\n", "line 1: not JSON at column 1: Expecting value"),
    (EVAL + "garbage\n" + STOP, "line 2: not JSON at column 1: Expecting value"),
    (EVAL + '{"event": "ev\n' + STOP, "line 2: not JSON at column 14: Invalid control character"),
    ("42\n", "line 1: a JSON int, not an object (a record)"),
    (EVAL + '["stop"]\n', "line 2: a JSON list, not an object (a record)"),
], ids=["one-line", "middle", "torn-mid-file", "number", "last-list"])
def test_a_bad_line_names_its_file_and_line(tmp_path: Path, text: str, problem: str) -> None:
    """Only a last line without its newline is torn (its writer killed); any other line that
    is not a JSON object is damage, named by file and line."""
    log = tmp_path / "events.jsonl"
    log.write_text(text)
    with pytest.raises(InputError) as caught:
        read_jsonl(log)
    assert str(caught.value).startswith(f"{log}: {problem}")


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text(EVAL + STOP + '{"event": "ev')
    assert [r["event"] for r in read_jsonl(log)] == ["eval", "stop"]


def test_a_writer_resumed_after_a_torn_line_keeps_its_records(tmp_path: Path) -> None:
    """A server killed mid-write, then resumed (``server --resume`` appends to its log):
    the torn record and the resumed writer's first one share a line; the torn one is
    skipped, the other read."""
    log = tmp_path / "events.jsonl"
    log.write_text(EVAL + '{"event": "ev' + '{"event": "resume", "t": 1.5}\n' + STOP)
    assert [r["event"] for r in read_jsonl(log)] == ["eval", "resume", "stop"]


@pytest.mark.parametrize(("damage", "problem"), [
    ("garbage\n", "line 1: not JSON at column 1: Expecting value"),
    ("42\n", "line 1: a JSON int, not an object (a record)"),
], ids=["garbage", "number"])
def test_a_damaged_run_is_a_failed_row_naming_its_log(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        damage: str, problem: str) -> None:
    """The other runs are still tabled; the damaged one is failed, with the file and line."""
    monkeypatch.setenv("COLUMNS", "400")
    bsp = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.3, 0.6])
    asp = fake_run(tmp_path, "r", "asp", "asp", [0.1, 0.6])
    study = study_recipe(bsp.parent, "bsp", "asp")
    (asp / "events.jsonl").write_text(damage)
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert "Traceback" not in out
    error = f"damaged log: {asp / 'events.jsonl'}: {problem}"
    assert f"asp asp failed: {error}" in flat(out)
    rows = {r["run"]: r for r in csv.DictReader((study / "table.csv").open())}
    assert rows["asp"]["error"] == error
    assert rows["asp"]["target_accuracy"] == "0.5"
    assert rows["bsp"]["error"] == "" and rows["bsp"]["time_to_target_s"] == "4.0"
    assert (study / "timeline-bsp.png").exists()


def failed_study(root: Path) -> tuple[Path, list[Path]]:
    """A study of two runs (target accuracy 0.5) that both failed."""
    runs = [with_settings(fake_run(root, "r", name, name, [0.1]), time_s=10)
            for name in ("bsp", "asp")]
    for run_dir in runs:
        write_summary(run_dir, failure(run_dir, "boom"))
    return study_recipe(runs[0].parent, "bsp", "asp"), runs


def test_a_report_of_failed_runs_knows_their_target(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A failed run's summary.json holds its error, not its target: the report reads the
    target from its recipe.json, so it does not say that no run set one."""
    study, _ = failed_study(tmp_path)
    code, out = run_main(capsys, "report", str(study))
    assert code == 1, out  # every run failed: report says so (exit 1)
    assert "no run set stop.target_accuracy" not in out
    assert "t@0.50" in out
    rows = list(csv.DictReader((study / "table.csv").open()))
    assert [(r["run"], r["target_accuracy"], r["workers"], r["error"]) for r in rows] == [
        ("bsp", "0.5", "2", "boom"), ("asp", "0.5", "2", "boom")]


def test_the_table_of_a_study_whose_runs_all_failed_knows_their_target(
        tmp_path: Path) -> None:
    """As `asyncsync run` tables it: the summaries it holds are the failed ones, without
    the target."""
    study, runs = failed_study(tmp_path)
    console = Console(record=True, width=300)
    publish(runs, [failure(r, "boom") for r in runs], "bsp", study, console)
    text = console.export_text()
    assert "no run set stop.target_accuracy" not in text and "t@0.50" in text


def test_report_on_a_file_says_report_takes_a_log_folder(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = tmp_path / "base.toml"
    recipe.write_text('name = "base"\n')
    assert one_error(run_main(capsys, "report", str(recipe))) == (
        f"error: {recipe}: is a file, not a folder: report takes a log folder "
        "(logs/RECIPE/STAMP, a run's folder in it, or a log root such as logs)")



def test_a_damaged_run_sent_to_a_tracker_is_no_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``report --track`` reads the logs as a live tracker does (tolerant of lines being
    written): a line that is not an object is skipped there, not a crash."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    bsp = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.3, 0.6])
    asp = fake_run(tmp_path, "r", "asp", "asp", [0.1, 0.6])
    study = study_recipe(bsp.parent, "bsp", "asp")
    (asp / "events.jsonl").write_text("42\n")
    code, out = run_main(capsys, "report", str(study), "--track",
                         f"tensorboard={tmp_path / 'tb'}")
    assert code == 0, out
    assert "tracked 2 runs" in out


def test_a_restarted_worker_counts_the_steps_its_killed_process_left(tmp_path: Path) -> None:
    """Worker 1 was killed after 4 steps (no final record, its last line torn) and
    restarted: the new process appended 10 steps and its final. The summary counted only
    the final's 10 steps and 80 samples."""
    from asyncsync.results.report import summarize_run
    from asyncsync.runlog.reading import final_records

    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    log = run_dir / "worker-1.jsonl"
    killed = "".join(json.dumps({"event": "compute", "t": 1.0 * i, "dur": 0.5, "steps": 1,
                                 "samples": 8, "loss": 1.0}) + "\n" for i in range(4))
    log.write_text(killed + '{"event": "push", "t": 4.0, "dur": 0.3, "held_s": 0.0, '
                   '"up": 10, "down": 5}\n{"event": "comp' + log.read_text())
    finals = final_records(run_dir)
    assert finals[0]["steps"] == 10 and "unfinished_steps" not in finals[0]
    assert (finals[1]["steps"], finals[1]["samples"], finals[1]["unfinished_steps"]) == (
        14, 112, 4)
    assert finals[1]["compute_s"] == 8.0 and finals[1]["wall_s"] == 10.0  # the last process's
    summary = summarize_run(run_dir)
    assert summary["steps"] == 24
    assert summary["samples_per_s"] == (80 + 112) / 10.0
    assert summary["compute_proportion_per_worker"] == [0.5, 0.8]


def test_a_worker_that_left_no_final_record_is_named_under_the_table(tmp_path: Path) -> None:
    """Worker 1's log was cut before its final record (and no process restarted it): the
    summary names it, and the table's legend says its work is not counted (smp/s used to
    drop it without a word)."""
    from asyncsync.results.report import comparison_table, summarize_run

    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    log = run_dir / "worker-1.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if '"final"' not in line))
    summary = summarize_run(run_dir)
    assert summary["workers_without_final"] == [1]
    assert summary["samples_per_s"] == 80 / 10.0  # worker 0's alone
    console = Console(width=300, record=True)
    console.print(comparison_table([summary], "a"))
    assert ("a: worker 1 left no final record (killed, or the log was cut): not in its "
            "totals, smp/s or comp") in " ".join(console.export_text().split())
    assert "workers_without_final" not in summarize_run(fake_run(tmp_path / "b", "r", "a",
                                                                 "asp", [0.1]))
