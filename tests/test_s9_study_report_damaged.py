"""A study with repeats where one repeat failed (or its log is damaged): the table's mean
is over the others, and the failed repeat is named with its error (it showed only a
"(1/2)" and no word of why)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.test_cli import run_main
from tests.test_report import fake_run
from tests.test_report_unfinished import flat


def test_a_failed_repeat_among_finished_ones_is_named_with_its_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for repeat in (0, 1):
        study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6], repeat=repeat).parent
        fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7], repeat=repeat)
    damaged = study / "asp-r0" / "worker-1.jsonl"
    damaged.write_bytes(damaged.read_bytes() + b"\n\x00\xff\n{}\n")
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    text = flat(out)
    assert "mean±95% interval over 2 repeats" in text
    assert f"asp: repeat 0 failed (its figures are over the others): damaged log: {study}" \
        in text, text
    assert "bsp: repeat" not in text and "asp: repeat 1" not in text


def test_a_finished_run_whose_events_were_cut_is_reported_damaged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Its summary.json says it finished, but events.jsonl stops mid-run (a copy cut
    short, a full disk): its figures rebuilt from that log were those of part of the run,
    shown as if whole, with no word."""
    study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6]).parent
    cut = fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.5, 0.7])
    events = cut / "events.jsonl"
    events.write_text("".join(events.read_text().splitlines(keepends=True)[:2]))
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    assert "asp asp failed: damaged log:" in flat(out), out
    rows = {row["run"]: row for row in csv.DictReader((study / "table.csv").open())}
    assert rows["asp"]["error"] == (f"damaged log: {events}: no stop record, though its "
                                    "summary.json says the run finished (the log was cut)")
    assert not rows["bsp"]["error"]
