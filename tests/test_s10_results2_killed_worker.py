"""A worker killed (SIGKILL: no final record) and started again with the same --log-dir
appends a second process's records to ``worker-<rank>.jsonl``. Both processes' work is in
the totals, and the table says where figures are only a lower bound."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from asyncsync.results.report import comparison_table, summarize_run
from asyncsync.runlog.reading import final_records
from tests.test_report import fake_run


def _compute(t: float) -> str:
    return json.dumps({"event": "compute", "t": t, "dur": 0.5, "steps": 1, "samples": 8,
                       "loss": 1.0}, separators=(",", ":"))

def test_a_killed_process_whole_last_record_without_its_newline_is_counted(
        tmp_path: Path) -> None:
    """The killed process's buffer ended right after its last record's ``}``: the restarted
    process's first record went on the same line. That last step was dropped (5 steps
    written, 4 counted)."""
    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    log = run_dir / "worker-1.jsonl"
    killed = "".join(_compute(1.0 * i) + "\n" for i in range(4)) + _compute(4.0)  # no \n
    log.write_text(killed + log.read_text())
    finals = final_records(run_dir)
    # by hand: killed 5 steps of 8 samples; restarted 10 steps, 80 samples (fake_run)
    assert (finals[1]["steps"], finals[1]["samples"]) == (15, 120)
    assert finals[1]["unfinished_steps"] == 5
    assert summarize_run(run_dir)["steps"] == 10 + 15

def test_the_table_notes_a_killed_and_restarted_worker(tmp_path: Path) -> None:
    """A two-process worker log (the first killed after 3 steps, its last line torn): the
    summary names the worker, and the notes say its totals are a lower bound (they said
    nothing)."""
    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    log = run_dir / "worker-1.jsonl"
    killed = "".join(_compute(1.0 * i) + "\n" for i in range(3)) + '{"event":"pu'
    log.write_text(killed + log.read_text())
    summary = summarize_run(run_dir)
    assert summary["steps"] == 10 + 13
    assert summary["workers_killed"] == [1]
    notes = " ".join(measured_text(comparison_table([summary], "a")).split())
    assert "worker 1 had a process killed and started again" in notes
    assert "a lower bound" in notes

def test_a_worker_stopped_cleanly_twice_is_not_noted_as_killed(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.1, 0.6])
    assert "workers_killed" not in summarize_run(run_dir)


def measured_text(renderable: object) -> str:
    """The renderable as plain text, 200 columns wide."""
    console = Console(width=200, file=io.StringIO())
    console.print(renderable)
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()
