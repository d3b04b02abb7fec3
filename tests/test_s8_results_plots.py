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


def test_a_failed_run_is_named_failed_in_the_time_to_target_chart(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As the table shows a failed row, the chart keeps the run's place, with ``failed``
    (not ``never``, which says it ran and missed the target); the other bars keep the
    colours of their accuracy lines."""
    from asyncsync.results.plots import plot_time_to_target

    failed = {**_summary("boom", 0.1, None), "error": "RuntimeError: boom"}
    summaries = [_summary("bsp", 0.1, 5.0), failed, _summary("asp", 0.1, None)]
    plt = pyplot.pyplot()
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    bars = plot_time_to_target(summaries, tmp_path / "ttt.png", [s["run"] for s in summaries])
    assert bars.labels == ["bsp@optim.lr=0.1", "boom@optim.lr=0.1", "asp@optim.lr=0.1"]
    assert bars.notes == ["", "failed", "never"]
    assert bars.heights == [5.0, None, None]
    (bar,) = figures[0].axes[0].patches
    assert bar.get_facecolor()[:3] == pytest.approx((0.12, 0.47, 0.71), abs=0.01)  # C0


def test_publish_draws_a_failed_run_in_the_time_to_target_chart(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from asyncsync.results.plots import plot_time_to_target
    from asyncsync.results.report import publish
    from tests.test_report import fake_run

    done = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6])
    broken = done.parent / "boom"
    broken.mkdir()
    (broken / "recipe.json").write_text((done / "recipe.json").read_text().replace(
        '"bsp"', '"boom"'))
    drawn: list[list[str]] = []

    def spy(summaries: list[dict[str, Any]], path: Path, names: list[str]) -> Any:
        drawn.append(names)
        return plot_time_to_target(summaries, path, names)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr("asyncsync.results.plots.plot_time_to_target", spy)
    try:
        publish([done, broken], [{"run": "bsp", **_done(done)}, {
            "recipe": "r", "run": "boom", "protocol": "boom", "error": "boom"}], "bsp",
            tmp_path / "out", Console(file=io.StringIO()))
    finally:
        monkeypatch.undo()
    assert drawn == [["bsp", "boom"]]


def _done(run_dir: Path) -> dict[str, Any]:
    from asyncsync.results.report import summarize_run

    return summarize_run(run_dir)


def test_a_sweep_point_never_at_the_target_breaks_its_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bsp never reached the target at lr 0.2: its time-to-target line stops there rather
    than running through a value it never had."""
    import math

    summaries = [_summary("bsp", lr, t) for lr, t in ((0.1, 5.0), (0.2, None), (0.3, 3.0))]
    figure = _drawn(monkeypatch, summaries, tmp_path / "sweep.png")
    (line,) = [line for line in figure.axes[0].get_lines() if line.get_marker() == "o"]
    ys = list(line.get_ydata())
    assert list(line.get_xdata()) == [0.1, 0.2, 0.3]
    assert ys[0] == 5.0 and math.isnan(ys[1]) and ys[2] == 3.0
