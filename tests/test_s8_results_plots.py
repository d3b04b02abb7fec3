"""The sweep plot on the edge cases a new user's studies met: a baseline that never reached
the target (its speedups are lower bounds, as the table's ``>=``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncsync.results import pyplot
from asyncsync.results.plots import plot_sweep

pytestmark = pytest.mark.skipif(not pyplot.matplotlib_available(), reason="needs matplotlib")


def _summary(run: str, lr: float, time_to_target: float | None) -> dict[str, Any]:
    sweep = {"optim.lr": lr}
    return {"recipe": "r", "run": f"{run}@optim.lr={lr}", "protocol": run, "repeat": 0,
            "sweep": sweep, "clock": "virtual", "wall_s": 10.0, "target_accuracy": 0.5,
            "time_to_target_s": time_to_target, "compute_proportion": 0.5}


def _drawn(monkeypatch: pytest.MonkeyPatch, summaries: list[dict[str, Any]],
           path: Path) -> Any:
    """The figure plot_sweep drew (kept open)."""
    plt = pyplot.pyplot()
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_sweep(summaries, "bsp", path)
    return figures[0]


def test_speedups_over_a_baseline_that_never_reached_the_target_are_marked_lower_bounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summaries = [_summary("bsp", 0.1, 5.0), _summary("asp", 0.1, 2.0),
                 _summary("bsp", 0.2, None), _summary("asp", 0.2, 4.0)]
    figure = _drawn(monkeypatch, summaries, tmp_path / "sweep.png")
    speedup = figure.axes[1]
    bounds = [line for line in speedup.get_lines() if line.get_marker() == "^"]
    assert len(bounds) == 1  # asp at lr 0.2: bsp's wall 10 s / 4 s, at least
    assert list(bounds[0].get_xdata()) == [0.2] and list(bounds[0].get_ydata()) == [2.5]
    exact = [line for line in speedup.get_lines() if line.get_marker() == "o"]
    assert [list(line.get_ydata()) for line in exact] == [[1.0], [2.5]]  # bsp, asp at 0.1
    labels = [text.get_text() for text in speedup.get_legend().get_texts()]
    assert "lower bound: the baseline never reached the target" in labels


def test_exact_speedups_draw_no_lower_bound_legend(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    summaries = [_summary("bsp", 0.1, 5.0), _summary("asp", 0.1, 2.0)]
    figure = _drawn(monkeypatch, summaries, tmp_path / "sweep.png")
    assert not [line for line in figure.axes[1].get_lines() if line.get_marker() == "^"]
    assert figure.axes[1].get_legend() is None


def test_a_one_value_sweeps_accuracy_title_sets_its_point_apart(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asyncsync.results.plots import plot_accuracy

    summaries = [{**_summary(run, 0.1, 2.0), "evaluations": [[0.0, 0.1], [2.0, 0.5]]}
                 for run in ("bsp", "asp")]
    plt = pyplot.pyplot()
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_accuracy(summaries, tmp_path / "accuracy.png", [s["run"] for s in summaries])
    assert figures[0].axes[0].get_title() == (
        "Accuracy of the global model vs virtual time (optim.lr=0.1)")
