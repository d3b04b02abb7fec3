"""`asyncsync report --track TOOL` without TOOL's package: one line naming `--track`.

docs/tracking.md: "A tracker whose package is missing stops the command before anything
runs or is written, with one line naming where it was asked for"; `run` says
`--track mlflow: ...`, and `report` said `tracking to mlflow needs ...`, after reading the
logs, or nothing of the tracker at all when the folder held no finished run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_report import fake_run

LINE = "error: --track mlflow: needs the mlflow package: pip install asyncsync[track]"
"""The line docs/tracking.md quotes for `asyncsync run`."""


@pytest.fixture
def no_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow absent, whether or not this environment has it (import and find_spec agree)."""
    monkeypatch.setitem(sys.modules, "mlflow", None)


@pytest.mark.usefixtures("no_mlflow")
def test_report_of_a_study_names_the_track_option(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    assert one_error(run_main(capsys, "report", str(run_dir.parent),
                              "--track", "mlflow")) == LINE
    assert not (run_dir.parent / "table.csv").exists()


@pytest.mark.usefixtures("no_mlflow")
def test_the_tracker_is_refused_before_the_folder_is_read(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    assert one_error(run_main(capsys, "report", str(tmp_path), "--track", "mlflow")) == LINE
