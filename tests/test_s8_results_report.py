"""The report's figures on edge cases of a new user's studies, checked against values
worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.results.comparison import speedup
from tests.test_cli import one_error, run_main
from tests.test_report import fake_run


def test_a_baseline_at_its_target_from_the_first_evaluation_is_no_lower_bound() -> None:
    """A baseline whose first evaluation (t = 0) met the target reached it: 0 s / 2 s,
    not its wall time / 2 s flagged as a lower bound."""
    assert speedup({"time_to_target_s": 2.0}, {"time_to_target_s": 0.0, "wall_s": 10.0}
                   ) == (0.0, False)
    assert speedup({"time_to_target_s": 2.0}, {"time_to_target_s": None, "wall_s": 10.0}
                   ) == (5.0, True)
    assert speedup({"time_to_target_s": 0.0}, {"time_to_target_s": 4.0}) == (None, False)


@pytest.mark.parametrize("old, new", [
    ('"accuracy": 0.6', '"accuracy": null'),
    ('"accuracy": 0.6, ', ""),
    ('"t": 2.0', '"t": "2.0"'),
])
def test_a_record_of_the_wrong_shape_is_a_damaged_row_not_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, old: str, new: str) -> None:
    """A record that parses but is not as asyncsync writes it (edited by hand, another
    tool's) makes its run a failed row naming the log, as a torn line does; the other runs
    are tabled."""
    damaged = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7])
    events = damaged / "events.jsonl"
    assert old in events.read_text()
    events.write_text(events.read_text().replace(old, new))
    code, out = run_main(capsys, "report", str(damaged.parent))
    assert code == 0 and "Traceback" not in out, out
    rows = [line.split() for line in out.splitlines()]
    assert next(r for r in rows if r[:1] == ["asp"])[2] == "2.0"
    bsp = next(r for r in rows if r[:1] == ["bsp"])
    assert bsp[:5] == ["bsp", "bsp", "failed:", "damaged", "log:"]
    assert str(damaged) in "".join(out.split())  # the error wraps in its row


def test_a_failed_summary_without_its_names_is_named_from_its_recipe(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7])
    (run_dir / "summary.json").write_text('{"error": 5}')
    code, out = run_main(capsys, "report", str(run_dir.parent))
    assert code == 0 and "Traceback" not in out, out
    assert ["bsp", "bsp", "failed:", "5"] in [line.split() for line in out.splitlines()]


def test_a_worker_count_that_is_no_integer_is_one_error_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    recipe = json.loads((run_dir / "recipe.json").read_text())
    recipe["runs"][0]["workers"] = "2"
    (run_dir / "recipe.json").write_text(json.dumps(recipe))
    assert one_error(run_main(capsys, "report", str(run_dir))) == (
        f"error: {run_dir}: not a run's log directory (recipe.json: TypeError: workers: "
        "expected an integer >= 1, got '2')")


def test_tracking_a_misshapen_evaluation_skips_it(tmp_path: Path) -> None:
    """``report --track`` of such a run sends the evaluations that are whole."""
    from asyncsync.tracking.feed import export_runs

    run_dir = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6, 0.7])
    events = run_dir / "events.jsonl"
    events.write_text(events.read_text().replace('"accuracy": 0.6', '"accuracy": null'))
    logged: list[float] = []

    class Recorder:
        def start(self, run: object) -> None: ...
        def log(self, run: object, point: Any, wall: float) -> None:
            logged.append(point.metrics["accuracy"])
        def finish(self, run: object, summary: object, step: int) -> None: ...
        def close(self) -> None: ...

    export_runs([run_dir], [Recorder()])
    assert logged == [0.1, 0.7]
