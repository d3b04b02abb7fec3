"""The study's live view in a narrow terminal: figures are never cut (the protocol column
goes, the run's name folds)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from asyncsync.study.dashboard import Dashboard
from asyncsync.study.recipe import load_recipe
from tests.test_dashboard import status

RECIPES = Path(__file__).parent.parent / "recipes"


def test_the_runs_in_progress_keep_their_figures_in_60_columns() -> None:
    recipe = load_recipe(RECIPES / "quickstart.toml")
    console = Console(width=60, record=True, color_system=None)
    dashboard = Dashboard(recipe, live=False, console=console)
    dashboard.study(total=8)
    for name in ("asp@compute.base_step_s=0.25-r0", "bsp@compute.base_step_s=0.25-r1"):
        dashboard._active[name] = (recipe.runs[1], {
            **status(0), "version": 5502, "accuracy": 0.898, "best_accuracy": 0.9,
            "elapsed_s": 3.0, "time_s": 3.0, "virtual_per_real": 0.061})
    console.print(dashboard.render_study())
    text = console.export_text()
    rows = [line.split() for line in text.splitlines() if "5502" in line]
    assert len(rows) == 2, text
    assert all(row[-6:] == ["3/3", "s", "5502", "0.898", "0.900", "0.061x"] for row in rows), text
    assert "…" not in text, text
    assert "asp@compute.bas" in text  # the name folds onto more lines, never cut


def test_a_runs_panel_in_60_columns_drops_whole_columns_rather_than_cut_figures() -> None:
    """A real run's panel, 4 workers on shaped links: what is shown is shown whole (60
    columns cut every cell, the rank's column to nothing)."""
    recipe = load_recipe(RECIPES / "wan.toml")
    console = Console(width=60, record=True, color_system=None)
    console.print(Dashboard(recipe, live=False, console=console).render(
        recipe.runs[0], 0, status(overruns=3)))
    text = console.export_text()
    assert "…" not in text, text
    header = next(line.split() for line in text.splitlines() if "state" in line)
    assert header[:2] == ["w", "slow"] and "state" in header and "ovr" in header, text
    rows = [line.split() for line in text.splitlines() if "1234" in line]
    assert [row[:2] for row in rows] == [["0", "1.5x"], ["1", "1.5x"], ["2", "1.5x"],
                                         ["3", "1.5x"]], text
    assert all(row[-1] == "3" and "50%" in row for row in rows), text


def test_the_views_render_with_no_run_in_progress_and_no_worker_yet() -> None:
    """The study's view once its last run in progress ended; a run's panel before any
    worker reported."""
    recipe = load_recipe(RECIPES / "wan.toml")
    console = Console(width=60, record=True, color_system=None)
    dashboard = Dashboard(recipe, live=False, console=console)
    dashboard.study(total=2, done=2)
    console.print(dashboard.render_study())
    console.print(dashboard.render(recipe.runs[0], 0, {**status(0), "workers": []}))
    text = console.export_text()
    assert "2/2 runs done" in text and "version 123" in text, text
