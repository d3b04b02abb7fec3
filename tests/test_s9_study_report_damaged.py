"""A study with repeats where one repeat failed (or its log is damaged): the table's mean
is over the others, and the failed repeat is named with its error (it showed only a
"(1/2)" and no word of why)."""

from __future__ import annotations

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
