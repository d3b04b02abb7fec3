"""The `report` table and table.csv from made-up summaries, against hand-computed speedups,
repeat counts and legends (mutation testing of `asyncsync.results.report`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncsync.results.report import comparison_table, write_csv


def summary(run: str, repeat: int, ttt: float | None, target: float = 0.5,
            sweep: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One repeat's summary.json as the table reads it."""
    return {"recipe": "r", "run": run, "protocol": run.split("@")[0], "workers": 2,
            "repeat": repeat, "seed": repeat, "sweep": sweep or {}, "clock": "virtual",
            "wall_s": 40.0, "target_accuracy": target, "time_to_target_s": ttt,
            "best_accuracy": 0.6, "compute_proportion": 0.5, **extra}


def table(summaries: list[dict[str, Any]]) -> str:
    """The table as printed, its lines joined by spaces."""
    console = Console(width=250, file=io.StringIO())
    console.print(comparison_table(summaries, "bsp", "study"))
    file = console.file
    assert isinstance(file, io.StringIO)
    return " ".join(file.getvalue().split())


def csv_speedups(summaries: list[dict[str, Any]], tmp_path: Path) -> dict[tuple[str, str], str]:
    with write_csv(summaries, "bsp", tmp_path / "table.csv").open(encoding="utf-8") as handle:
        return {(row["run"], row["repeat"]): row["speedup"] for row in csv.DictReader(handle)}


def test_each_repeat_is_compared_with_the_baselines_repeat_of_its_seed(
        tmp_path: Path) -> None:
    runs = [summary("bsp", 0, 10.0), summary("bsp", 1, 20.0),
            summary("asp", 0, 5.0), summary("asp", 1, 5.0)]
    # asp's speedups: 10 / 5 = 2 and 20 / 5 = 4: mean 3, half 12.706 * sqrt(2) / sqrt(2)
    assert "3.00x [0.00, 15.71]" in table(runs)
    assert csv_speedups(runs, tmp_path) == {("bsp", "0"): "1.0", ("bsp", "1"): "1.0",
                                            ("asp", "0"): "2.0", ("asp", "1"): "4.0"}


def test_one_lower_bound_among_the_repeats_makes_the_mean_one() -> None:
    # bsp's repeat 0 never reached the target: 40 s wall / 5 s = 8 is a lower bound
    runs = [summary("bsp", 0, None), summary("bsp", 1, 20.0),
            summary("asp", 0, 5.0), summary("asp", 1, 5.0)]
    assert ">=6.00x" in table(runs)  # (8 + 4) / 2


def test_each_sweep_point_is_compared_with_its_own_baseline(tmp_path: Path) -> None:
    runs = []
    for lr, base, mine in ((0.1, 10.0, 5.0), (0.3, 40.0, 10.0)):
        point = {"optim.lr": lr}
        runs += [summary(f"bsp@optim.lr={lr}", 0, base, sweep=point),
                 summary(f"asp@optim.lr={lr}", 0, mine, sweep=point)]
    out = table(runs)
    assert "asp@optim.lr=0.1 asp 5.0" in out and "2.00x" in out and "4.00x" in out
    assert csv_speedups(runs, tmp_path)[("asp@optim.lr=0.3", "0")] == "4.0"


def test_a_failed_repeat_leaves_its_run_over_2_of_3() -> None:
    runs = [summary("bsp", k, 10.0) for k in range(3)]
    runs += [summary("asp", 0, 4.0), summary("asp", 1, 6.0),
             {**summary("asp", 2, None), "error": "boom"}]
    out = table(runs)
    assert "5.0 [0.0, 17.7] (2/3)" in out  # 5 ± 12.706 * sqrt(2) / sqrt(2) = 5 ± 12.7
    # speedups 10/4 = 2.5 and 10/6 = 5/3: mean 25/12, half 12.706 * (5/6) / 2 = 5.294
    assert "2.08x [0.00, 7.38] (2/3)" in out
    assert "asp: repeat 2 failed (its figures are over the others): boom" in out
    assert "of 3 repeats finished" not in out


def test_a_run_with_fewer_repeats_is_named_and_the_caption_counts_the_most() -> None:
    runs = [summary("bsp", k, 10.0 + k) for k in range(3)] + [summary("asp", 0, 4.0),
                                                               summary("asp", 1, 6.0)]
    out = table(runs)
    assert "mean±95% interval over 3 repeats" in out
    assert "asp: 2 of 3 repeats finished (its figures are over those)" in out
    assert "bsp: 3 of 3" not in out
    assert "with 2 repeats the 95% intervals are very wide (Student's t with 1 degree of " \
           "freedom)" in out


def test_one_repeat_gets_no_interval_and_no_warning() -> None:
    out = table([summary("bsp", 0, 10.0), summary("asp", 0, 4.0)])
    assert "very wide" not in out and "repeats" not in out and "2.50x" in out


def test_runs_with_different_targets_say_so_in_increasing_order() -> None:
    out = table([summary("bsp", 0, 10.0, target=0.7), summary("asp", 0, 4.0, target=0.5)])
    assert "t@target: seconds to the first evaluation >= target" in out
    assert "t@0.50" not in out and "t@0.70" not in out
    assert "the runs' targets differ (0.5, 0.7)" in out


def test_a_target_with_three_decimals_is_written_whole() -> None:
    """A target of 0.995 was headed ``t@0.99`` and its legend said ``>= 0.99``."""
    runs = [summary("bsp", 0, 10.0, target=0.995), summary("asp", 0, 4.0, target=0.995)]
    out = table(runs)
    assert "t@0.995" in out and "seconds to the first evaluation >= 0.995" in out
    assert "0.99 " not in out and "0.99;" not in out
    assert "t@0.80" in table([summary("bsp", 0, 10.0, target=0.8)])
