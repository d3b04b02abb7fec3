"""A report of runs whose target accuracies differ (two recipes, say) labels each time to
target with its own run's target, in the table and in the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.results import plots
from asyncsync.results.report import comparison_table

pytest.importorskip("matplotlib")


def summary(recipe: str, run: str, target: float, ttt: float) -> dict[str, Any]:
    """A run that evaluated at 0, 2 and 4 s and first reached `target` at `ttt`."""
    return {"recipe": recipe, "run": run, "protocol": run, "workers": 2, "repeat": 0,
            "seed": 0, "sweep": {}, "clock": "virtual", "wall_s": 10.0,
            "target_accuracy": target, "time_to_target_s": ttt,
            "compute_proportion_per_worker": [0.5, 0.8],
            "evaluations": [[0.0, 0.1], [2.0, 0.27], [4.0, 0.35]]}


MIXED = [summary("pop", "fedavg", 0.3, 4.0), summary("sw", "fedbuff", 0.25, 2.0)]


def test_the_table_does_not_head_every_time_with_the_first_runs_target() -> None:
    console = Console(record=True, width=300, color_system=None)
    console.print(comparison_table(MIXED, "fedavg"))
    text = " ".join(console.export_text().split())
    assert "t@0.30" not in text and ">= 0.30" not in text
    assert "t@target" in text
    assert "targets differ (0.25, 0.3)" in text


def test_one_target_still_heads_the_column_with_its_value() -> None:
    console = Console(record=True, width=300, color_system=None)
    console.print(comparison_table(MIXED[:1], "fedavg"))
    assert "t@0.30" in console.export_text()


def test_the_plots_mark_each_run_at_its_own_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figures to look at them
    names = [f"{s['recipe']}/{s['run']}" for s in MIXED]
    plots.plot_accuracy(MIXED, tmp_path / "accuracy.png", names)
    bars = plots.plot_time_to_target(MIXED, tmp_path / "ttt.png", names)
    monkeypatch.undo()
    (axes,) = figures[0].axes
    dots = {(float(line.get_xdata()[0]), float(line.get_ydata()[0]))
            for line in axes.get_lines() if line.get_marker() == "o"}
    assert dots == {(4.0, 0.3), (2.0, 0.25)}  # each run's dot on its own target
    legend = figures[0].legends[0] if figures[0].legends else axes.get_legend()
    entries = [text.get_text() for text in legend.get_texts()]
    assert "target 0.25" in entries and "target 0.3" in entries
    assert "0.25" in bars.title and "0.3" in bars.title
    for figure in figures:
        plt.close(figure)
