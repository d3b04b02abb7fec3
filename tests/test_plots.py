"""The time-to-target bar chart and the accuracy plot, from summaries written by hand."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.results import plots, timeline
from asyncsync.results.comparison import interval
from asyncsync.results.report import comparison_table
from asyncsync.runlog.schema import KEY, Kind

pytest.importorskip("matplotlib")

T_2_DOF = 4.303  # Student's t quantile 0.975, 2 degrees of freedom (3 values)


def summary(run: str, repeat: int, ttt: float | None, recipe: str = "r",
            sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """A summary.json's fields that the plots read, for a run that evaluated at 0, 2, 4 s."""
    return {"recipe": recipe, "run": run, "protocol": run.split("@")[0], "workers": 2,
            "repeat": repeat, "seed": repeat, "sweep": sweep or {}, "clock": "virtual",
            "wall_s": 10.0, "target_accuracy": 0.7, "time_to_target_s": ttt,
            "compute_proportion_per_worker": [0.5, 0.8],
            "evaluations": [[0.0, 0.1], [2.0, 0.4 + 0.01 * repeat], [4.0, 0.75]]}


def repeats(run: str, times: Sequence[float | None], **kwargs: Any) -> list[dict[str, Any]]:
    """A run's repeats, one per time to target (None: never reached)."""
    return [summary(run, k, t, **kwargs) for k, t in enumerate(times)]


def mean_and_half(values: list[float]) -> tuple[float, float]:
    """The mean and the 95% t-interval's half-width for 3 values, written out here."""
    assert len(values) == 3
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    return mean, T_2_DOF * sd / math.sqrt(3)


def test_bars_are_the_mean_and_the_tables_interval_of_the_repeats_that_reached_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to count its bars
    summaries = (repeats("bsp", [6.0, 6.0, 8.0]) + repeats("asp", [2.0, None, 4.0, 3.0, None])
                 + repeats("ssp", [None, None, None]) + repeats("solo", [5.0]))
    bars = plots.plot_time_to_target(summaries, tmp_path / "ttt.png",
                                     [s["run"] for s in summaries])
    (axes,) = figures[0].axes
    assert sorted(round(p.get_x() + p.get_width() / 2) for p in axes.patches) == [0, 1, 3]
    monkeypatch.undo()
    plt.close(figures[0])
    assert bars.labels == ["bsp", "asp", "ssp", "solo"]
    bsp, asp = mean_and_half([6.0, 6.0, 8.0]), mean_and_half([2.0, 4.0, 3.0])
    assert bsp[1] == pytest.approx(2.8687, abs=1e-4)  # 4.303 * sqrt(4/3) / sqrt(3), by hand
    assert bars.heights[:2] == [pytest.approx(bsp[0]), pytest.approx(asp[0])]
    assert bars.errors[:2] == [pytest.approx(bsp[1]), pytest.approx(asp[1])]
    assert bars.dots[:2] == [[6.0, 6.0, 8.0], [2.0, 4.0, 3.0]]
    assert bars.notes[:2] == ["", "3/5"]  # asp: 3 of its 5 repeats reached the target
    # ssp never reached it: no bar, no dots, but its label and "never"
    assert (bars.heights[2], bars.errors[2], bars.dots[2], bars.notes[2]) == (
        None, None, [], "never")
    assert (bars.heights[3], bars.errors[3], bars.dots[3]) == (5.0, None, [5.0])
    assert bars.ylabel == "virtual time to target (s)" and "0.7" in bars.title
    # the same numbers the table prints
    text = _table(summaries)
    assert f"{bsp[0]:.1f}±{bsp[1]:.1f}" in text and f"{asp[0]:.1f}±{asp[1]:.1f} (3/5)" in text
    assert bars.path.stat().st_size < 100_000


def test_sweep_points_are_bars_of_their_own_labelled_as_in_the_table(tmp_path: Path) -> None:
    summaries = []
    for lr, times in ((0.1, [4.0, 5.0, 9.0]), (0.3, [3.0, 3.0, 3.5])):
        for recipe in ("a", "b"):
            summaries += repeats(f"bsp@optim.lr={lr}", times, recipe=recipe,
                                 sweep={"optim.lr": lr})
    names = [f"{s['recipe']}/{s['run']}" for s in summaries]  # two recipes: recipe/run
    bars = plots.plot_time_to_target(summaries, tmp_path / "ttt.png", names)
    assert bars.labels == ["a/bsp@optim.lr=0.1", "b/bsp@optim.lr=0.1", "a/bsp@optim.lr=0.3",
                           "b/bsp@optim.lr=0.3"]
    half = interval([4.0, 5.0, 9.0])[1]
    assert half == pytest.approx(mean_and_half([4.0, 5.0, 9.0])[1])
    assert bars.heights[0] == pytest.approx(6.0) and bars.errors[0] == pytest.approx(half)
    assert bars.heights[2:] == [pytest.approx(19 / 6)] * 2
    assert all(row in _table(summaries) for row in bars.labels)


def test_write_plots_draws_the_bars_only_with_a_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "plot_timeline", lambda run_dir, path, name, clock: path)
    with_target = repeats("bsp", [6.0, 8.0, None]) + repeats("asp", [2.0, 3.0, 4.0])
    no_target = [{**s, "target_accuracy": None, "time_to_target_s": None}
                 for s in with_target]
    for case, summaries in (("with", with_target), ("without", no_target)):
        out = tmp_path / case
        out.mkdir()
        files = plots.write_plots([tmp_path] * len(summaries), summaries, out, "bsp")
        names = {f.name for f in files}
        assert ("time_to_target.png" in names) == (case == "with")
        assert "accuracy.png" in names
    png = tmp_path / "with" / "time_to_target.png"
    assert 1000 < png.stat().st_size < 100_000


def test_the_accuracy_plot_of_many_sweep_points_has_a_panel_each_and_names_its_band(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight runs at four sweep points, five repeats each: a panel per point, one legend
    entry per run, and the band named for what it is (not a confidence interval)."""
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at it
    runs = ("bsp", "asp", "ssp", "esync", "wbsp", "dcasgd", "fedavg", "diloco")
    summaries = [s for lr in (0.01, 0.03, 0.1, 0.3) for run in runs
                 for s in repeats(f"{run}@optim.lr={lr}", [2.0, 4.0, None, 4.0, 2.0],
                                  sweep={"optim.lr": lr})]
    path = plots.plot_accuracy(summaries, tmp_path / "accuracy.png",
                               [s["run"] for s in summaries])
    assert 1000 < path.stat().st_size < 300_000
    (figure,) = figures
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [
        "optim.lr=0.01", "optim.lr=0.03", "optim.lr=0.1", "optim.lr=0.3"]
    assert all(len(ax.get_lines()) == len(runs) * 2 + 1 for ax in panels)  # mean, dots, target
    entries = [text.get_text() for text in figure.legends[0].get_texts()]
    assert entries == [*runs, "line: mean of 5 repeats", "band: min-max over repeats",
                       "time to target (a dot per repeat)", "target 0.7"]
    monkeypatch.undo()
    plt.close(figure)


def _table(summaries: list[dict[str, Any]]) -> str:
    console = Console(record=True, width=300, color_system=None)
    console.print(comparison_table(summaries, "bsp"))
    return console.export_text()


def test_a_timeline_of_many_workers_draws_32_from_the_least_to_the_most_busy() -> None:
    """Worker r computes r/100 of its time: the 32 rows are spread over all 100 (ranks 0
    and 99 included) and a run of 32 or fewer workers keeps every worker."""
    def finals(count: int) -> dict[int, dict[str, Any]]:
        return {rank: {KEY: Kind.FINAL, "compute_s": rank / 100, "wall_s": 1.0, "steps": 1}
                for rank in range(count)}

    ranks = timeline.timeline_ranks(range(100), finals(100))
    assert len(ranks) == 32 and ranks[0] == 0 and ranks[-1] == 99
    gaps = {b - a for a, b in itertools.pairwise(ranks)}
    assert gaps <= {3, 4}  # evenly spread: 99 / 31 = 3.2 ranks apart
    assert timeline.timeline_ranks(range(32), finals(32)) == list(range(32))
