"""A tracker that fails in the middle of a ``--jobs 1`` study: the study stops, as it does
with ``--jobs 2``, but it also prints the table of the runs that finished before, where the
logs are and how to go on (``--resume``), before its one ``error:`` line; it said only that
line. (A tracker that fails at the study's first run, with nothing finished, still says the
one line: tests/test_s11_cli3_tracker_start.py.)"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.test_s12_study3_jobs_tracker import CAUSE, run_tracked

RECIPE = """
name = "small"
repeats = 2
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 4
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 1
[defaults.compute]
base_step_s = 0.1
[[runs]]
name = "bsp"
protocol = "bsp"
"""
def test_the_runs_done_before_a_tracker_failure_are_tabled(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    code, out = run_tracked(capsys, monkeypatch, tmp_path, RECIPE, failing=1, jobs=1)
    (study,) = (tmp_path / "logs" / "small").iterdir()
    failed = f"tracking to flaky: could not log run small/{study.name}/bsp-r1: {CAUSE}"
    lines = [" ".join(line.split()) for line in out.splitlines() if line.strip()]
    flat = " ".join(lines)
    assert code == 2 and "Traceback" not in out, out
    assert [line for line in lines if line.startswith("error: ")] == [f"error: {failed}"]
    assert lines[-1] == f"error: {failed}", out  # the cause is the last word
    assert (f"a tracker failed: the runs in progress are marked interrupted in their "
            f"summary.json; continue with asyncsync run {tmp_path / 'small.toml'} --resume "
            f"{study} (with the same --set options, if any)") in flat, out
    assert f"logs: {study}" in flat, out
    with (study / "table.csv").open() as table:  # the one run that finished, tabled
        rows = list(csv.DictReader(table))
    assert [(row["run"], row["repeat"]) for row in rows] == [("bsp", "0")], rows
    assert f"wrote {study / 'table.csv'}" in flat, out
