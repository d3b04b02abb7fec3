"""A run's figures in summary.json, from a small log written here, against hand-computed
values (mutation testing of `asyncsync.results.report.summarize_run`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.results.report import report_summary, summarize_run

# accuracies in eighths, so that every mean of three is exact in binary
EVALS = [(0.0, 0.125), (2.0, 0.25), (4.0, 0.5), (7.0, 0.375), (9.0, 0.625), (11.0, 0.75),
         (13.0, 0.625)]
FINALS = {0: {"steps": 10, "samples": 100, "compute_s": 4.0, "wall_s": 10.0,
              "bytes_up": 3_000_000, "bytes_down": 500_000},
          1: {"steps": 14, "samples": 140, "compute_s": 6.0, "wall_s": 8.0,
              "bytes_up": 1_000_000, "bytes_down": 1_500_000},
          3: {"steps": 0, "samples": 0, "compute_s": 0.0, "wall_s": 0.0,
              "bytes_up": 0, "bytes_down": 0}}  # worker 2 left no final record


def write_run(root: Path, evals: list[tuple[float, float]], stop_t: float | None = 16.0,
              finals: dict[int, dict[str, Any]] | None = None) -> Path:
    """A 4-worker run's recipe.json, events.jsonl and workers' logs (no summary.json)."""
    root.mkdir(parents=True)
    spec = {"name": "a", "protocol": {"name": "asp"}, "workers": 4, "seed": 0,
            "stop": {"target_accuracy": 0.5, "time_s": 30}, "eval": {"interval_s": 2.0}}
    (root / "recipe.json").write_text(json.dumps({"name": "r", "runs": [spec]}))
    events: list[dict[str, Any]] = [{"event": "eval", "t": t, "version": i, "accuracy": a,
                                     "loss": 1.0} for i, (t, a) in enumerate(evals)]
    if stop_t is not None:
        events.append({"event": "stop", "t": stop_t, "versions": 40, "mean_staleness": 1.25,
                       "max_staleness": 3})
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for rank, final in (FINALS if finals is None else finals).items():
        (root / f"worker-{rank}.jsonl").write_text(json.dumps({"event": "final", **final})
                                                   + "\n")
    return root


def test_every_figure_of_a_run(tmp_path: Path) -> None:
    summary = summarize_run(write_run(tmp_path / "a", EVALS))
    assert summary["wall_s"] == 16.0  # the stop record's time, not the last evaluation's
    assert summary["time_to_target_s"] == 4.0  # 0.5 reaches the target 0.5
    # means of 3: 0.29, 0.375, then (0.5 + 0.375 + 0.625) / 3 = 0.5 at t = 9
    assert summary["time_to_target_avg_s"] == 9.0
    assert summary["best_accuracy"] == 0.75 and summary["final_accuracy"] == 0.625
    # per worker compute_s / its own wall_s: 4/10, 6/8; none for 2 (no final) and 3 (0 s)
    assert summary["compute_proportion_per_worker"] == [0.4, 0.75, None, None]
    assert summary["compute_proportion"] == 0.575  # (0.4 + 0.75) / 2: the known ones
    assert summary["samples_per_s"] == 15.0  # 240 samples / 16 s
    assert summary["steps"] == 24
    assert (summary["bytes_up"], summary["bytes_down"]) == (4_000_000, 2_000_000)
    assert summary["mb_moved"] == 6.0
    assert summary["eval_interval_mean_s"] == 2.167  # 13 s / 6 gaps
    assert summary["eval_interval_max_s"] == 3.0
    assert summary["eval_slipped"] is False  # 3 s is not more than 1.5 * 2 s
    assert summary["workers_without_final"] == [2]
    assert "workers_killed" not in summary
    assert (summary["versions"], summary["mean_staleness"], summary["max_staleness"]) == (
        40, 1.25, 3)


@pytest.mark.parametrize(("gap", "slipped"), [(3.0, False), (3.5, True), (4.5, True)])
def test_evaluations_slip_past_one_and_a_half_intervals(tmp_path: Path, gap: float,
                                                         slipped: bool) -> None:
    evals = [(0.0, 0.1), (2.0, 0.2), (2.0 + gap, 0.3)]
    assert summarize_run(write_run(tmp_path / "a", evals))["eval_slipped"] is slipped


def test_the_first_three_evaluations_can_make_the_smoothed_time(tmp_path: Path) -> None:
    evals = [(1.0, 0.5), (2.0, 0.5), (3.0, 0.5), (4.0, 0.1)]
    summary = summarize_run(write_run(tmp_path / "a", evals))
    assert (summary["time_to_target_s"], summary["time_to_target_avg_s"]) == (1.0, 3.0)


def test_a_run_whose_events_lost_their_stop_record_is_reported_damaged(
        tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "a", EVALS, stop_t=None)
    (run_dir / "summary.json").write_text(json.dumps({"run": "a"}))
    summary = report_summary(run_dir)
    assert "no stop record" in summary["error"] and "events.jsonl" in summary["error"]
