"""A 95% t-interval over few repeats is wide and symmetric: for a time to target it could
reach below 0 s (and an accuracy's above 1). The table and the plots show it clipped to
what the figure can be, and say so."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.results.report import comparison_table

T_2_DOF = 4.303  # Student's t quantile 0.975, 2 degrees of freedom (3 values)
# times [1, 2, 9]: mean 4, deviations -3, -2, 5, variance 38 / 2 = 19
HALF = T_2_DOF * math.sqrt(19) / math.sqrt(3)  # = 10.83: 4 - 10.83 < 0
# accuracies [0.90, 0.95, 0.99]: mean 0.9467, variance 0.004067 / 2
ACC_MEAN = (0.90 + 0.95 + 0.99) / 3
ACC_HALF = T_2_DOF * math.sqrt(((0.90 - ACC_MEAN) ** 2 + (0.95 - ACC_MEAN) ** 2
                                + (0.99 - ACC_MEAN) ** 2) / 2) / math.sqrt(3)


def run(name: str, times: list[float], accuracies: list[float],
        sweep: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A run's repeats as summary.json has them (what the table and plots read)."""
    return [{"recipe": "r", "run": name, "protocol": name.split("@")[0], "workers": 2,
             "repeat": k, "seed": k, "sweep": sweep or {}, "clock": "virtual",
             "wall_s": 20.0, "target_accuracy": 0.7, "time_to_target_s": t,
             "best_accuracy": a, "compute_proportion": 0.5,
             "compute_proportion_per_worker": [0.5, 0.5],
             "evaluations": [[0.0, 0.1], [t, a]]}
            for k, (t, a) in enumerate(zip(times, accuracies, strict=True))]


def text(summaries: list[dict[str, Any]]) -> str:
    console = Console(width=250, file=io.StringIO())
    console.print(comparison_table(summaries, "bsp"))
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def test_the_table_clips_an_interval_below_zero_and_says_so() -> None:
    out = text(run("bsp", [10.0, 11.0, 12.0], [0.8, 0.8, 0.8])
               + run("asp", [1.0, 2.0, 9.0], [0.90, 0.95, 0.99]))
    assert f"4.0 [0.0, {4 + HALF:.1f}]" in out  # it was 4.0±10.8: down to -6.8 s
    assert f"{ACC_MEAN:.3f} [{ACC_MEAN - ACC_HALF:.3f}, 1.000]" in out  # not up to 1.059
    # bsp's: 11 ± 4.303 * 1 / sqrt(3), inside the range: as it was
    assert f"11.0±{T_2_DOF / math.sqrt(3):.1f}" in out
    assert "shown clipped there" in " ".join(out.split())


def test_an_interval_inside_the_range_has_no_clipping_note() -> None:
    out = text(run("bsp", [10.0, 11.0, 12.0], [0.8, 0.8, 0.8]))
    assert "clipped" not in out and " [" not in out


def test_the_sweep_plot_clips_its_error_bars(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from asyncsync.results import plots

    drawn: list[tuple[str, Any]] = []
    errorbar = Axes.errorbar

    def spy(self: Axes, x: Any, y: Any, yerr: Any = None, **options: Any) -> Any:
        drawn.append((self.get_title(), yerr))
        return errorbar(self, x, y, yerr=yerr, **options)

    monkeypatch.setattr(Axes, "errorbar", spy)
    summaries = []
    for lr in (0.1, 0.3):
        point = {"optim.lr": lr}
        summaries += run(f"bsp@optim.lr={lr}", [10.0, 11.0, 12.0], [0.8] * 3, point)
        summaries += run(f"asp@optim.lr={lr}", [1.0, 2.0, 9.0], [0.9] * 3, point)
    for s in summaries:
        if s["run"].startswith("asp"):  # compute proportions 0.5, 0.9, 1.0: mean 0.8
            s["compute_proportion"] = (0.5, 0.9, 1.0)[s["repeat"]]
    plots.plot_sweep(summaries, "bsp", tmp_path / "sweep.png")
    by_panel = dict.fromkeys(("time to target (s)", "compute proportion"))
    for title, yerr in drawn:  # the last line drawn in each panel is asp's
        if title in by_panel:
            by_panel[title] = yerr
    below, above = by_panel["time to target (s)"]
    assert below == [pytest.approx(4.0)] * 2  # down to 0, not to 4 - 10.83
    assert above == [pytest.approx(HALF)] * 2
    comp_half = T_2_DOF * math.sqrt((0.09 + 0.01 + 0.04) / 2) / math.sqrt(3)
    below, above = by_panel["compute proportion"]
    assert below == [pytest.approx(min(comp_half, 0.8))] * 2
    assert above == [pytest.approx(1.0 - 0.8)] * 2  # up to 1, not to 0.8 + 0.46


def test_the_bar_chart_whisker_stops_at_zero(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from asyncsync.results import plots

    summaries = run("asp", [1.0, 2.0, 9.0], [0.9] * 3)
    bars = plots.plot_time_to_target(summaries, tmp_path / "t.png", ["asp"] * 3)
    assert bars.bottoms == [pytest.approx(0.0)]
    assert bars.errors == [pytest.approx(HALF)]


def test_the_sweep_plot_draws_a_point_without_values(tmp_path: Path) -> None:
    """A sweep point where no repeat reached the target has no time to plot: the clipped
    error bars raised ZeroDivisionError there (a single sweep value, one run never
    reaching the target, as a user's report of a small sweep has)."""
    pytest.importorskip("matplotlib")
    from asyncsync.results import plots

    point = {"optim.lr": 0.1}
    summaries = (run("bsp@optim.lr=0.1", [10.0, 11.0], [0.8] * 2, point)
                 + run("asp@optim.lr=0.1", [1.0, 2.0], [0.9] * 2, point))
    for s in summaries[2:]:
        s["time_to_target_s"] = None
    assert plots.plot_sweep(summaries, "bsp", tmp_path / "s.png").stat().st_size > 0
