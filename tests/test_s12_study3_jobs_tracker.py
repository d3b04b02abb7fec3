"""A tracker that fails in the middle of a ``--jobs 2`` study: the run it cut gets a
summary.json saying so (it had none), and the run beside it, cut because the study stopped,
says that cause too (it said "interrupted (Ctrl-C)"), as a ``--jobs 1`` study records its
one run; ``report`` then names both, and ``--resume`` runs them again."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from asyncsync.study import runner
from asyncsync.tracking import Point, RunInfo, follow
from tests.test_cli import run_main

RECIPE = """
name = "small"
repeats = 2
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 600
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 2
[defaults.compute]
base_step_s = 0.1
[[runs]]
name = "bsp"
protocol = "bsp"
"""
"""600 virtual s: repeat 1 must still be running when repeat 0's tracker fails at its
first evaluation (2 virtual s in); with 30 s, a loaded host once started repeat 0's
process late enough for repeat 1 to finish first, and keep its own summary."""
CAUSE = "ConnectionError: the tracking server went away"


class FailsOnRepeat:
    """A tracker whose ``log`` of one repeat fails; the other's calls all succeed."""

    label = "tracking to flaky"

    def __init__(self, failing: int) -> None:
        self.failing = failing

    def start(self, run: RunInfo) -> None:
        pass

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        if run.repeat == self.failing:
            raise ConnectionError("the tracking server went away")

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


def run_tracked(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path, recipe: str, failing: int, jobs: int) -> tuple[int, str]:
    """`asyncsync run` of `recipe` (as tmp_path/small.toml) with `--jobs` `jobs`, tracked by
    a `FailsOnRepeat(failing)` polled every 10 ms: its exit status and output."""
    monkeypatch.setattr(runner, "refuse_missing", lambda *given: None)
    monkeypatch.setattr(runner, "parse_track", lambda spec: FailsOnRepeat(failing))
    monkeypatch.setattr(runner, "follow", functools.partial(follow, every_s=0.01))
    (tmp_path / "small.toml").write_text(recipe)
    return run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain", "--jobs",
                    str(jobs), "--logs", str(tmp_path / "logs"), "--track", "flaky")


def test_a_tracker_failure_in_a_parallel_study_is_recorded_in_both_runs(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    code, out = run_tracked(capsys, monkeypatch, tmp_path, RECIPE, failing=0, jobs=2)
    assert code == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    (study,) = (tmp_path / "logs" / "small").iterdir()
    failed = f"tracking to flaky: could not log run small/{study.name}/bsp-r0: {CAUSE}"
    assert errors == [f"error: {failed}"], out
    for run in ("bsp-r0", "bsp-r1"):  # repeat 1 was cut by repeat 0's failure
        summary = json.loads((study / run / "summary.json").read_text())
        assert summary["interrupted"] is True, run
        assert summary["error"] == f"interrupted: {failed}", run

    code, out = run_main(capsys, "report", str(study))
    flat = " ".join(out.split())
    assert code == 2, out
    for run in ("bsp-r0", "bsp-r1"):
        assert f"{study / run}: left out, it was interrupted: {failed}" in flat, out
    assert "no summary.json" not in flat, out
