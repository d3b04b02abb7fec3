"""A run with fewer finished repeats than the others (the rest interrupted or not yet
run) says so: its single figure is not a mean over the repeats the title names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import run_main
from tests.test_report import fake_run
from tests.test_report_unfinished import flat


def test_a_run_short_of_repeats_is_named(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    for repeat in (0, 1):
        study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6], repeat=repeat).parent
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7], repeat=0)
    code, out = run_main(capsys, "report", str(study))
    assert code == 0, out
    text = flat(out)
    assert "mean±95% interval over 2 repeats" in text
    assert "asp: 1 of 2 repeats finished (its figures are over that one)" in text
    assert "bsp: 2 of 2" not in text and "bsp: 1 of 2" not in text
