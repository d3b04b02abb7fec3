"""The study's time-left estimate with runs that stop early at their target, and the
dashboard in a narrow terminal."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.study import dashboard as dashboard_module
from asyncsync.study.dashboard import Dashboard
from asyncsync.study.recipe import Recipe, load_recipe

RECIPE = """
name = "early"
baseline = "a"

[defaults]
workers = 2
clock = "virtual"

[defaults.stop]
time_s = 100
target_accuracy = 0.5
stop_at_target = {stop}

[[runs]]
name = "a"
protocol = "asp"

[[runs]]
name = "b"
protocol = "bsp"

[[runs]]
name = "c"
protocol = "ssp"
"""

FINISHED = {"best_accuracy": 0.5, "final_accuracy": 0.5, "time_to_target_s": 20.0,
            "compute_proportion": 0.5}


class Clock:
    """The dashboard's `now`, set by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _recipe(tmp_path: Path, stop: bool) -> Recipe:
    path = tmp_path / "early.toml"
    path.write_text(RECIPE.replace("{stop}", "true" if stop else "false"))
    return load_recipe(path)


def _status(elapsed_s: float) -> dict[str, Any]:
    return {"version": 1, "accuracy": 0.1, "best_accuracy": 0.1, "elapsed_s": elapsed_s,
            "time_s": 100.0, "started": True, "workers": []}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    ticking = Clock()
    monkeypatch.setattr(dashboard_module, "now", ticking)
    return ticking


def test_the_time_left_comes_from_the_runs_finished_not_their_budgets(
        tmp_path: Path, clock: Clock) -> None:
    """One at a time: `a` stopped at its target after 10 s (20 of its 100 virtual s); `b`
    has run 5 s (10 virtual s). At 10 s a run, `b` has 5 s left and `c` 10 s: 15 s (the
    budgets' pace said 26 s)."""
    recipe = _recipe(tmp_path, stop=True)
    dashboard = Dashboard(recipe, live=False, console=Console(file=io.StringIO()))
    dashboard.study(total=3)
    dashboard.update_run("a", recipe.runs[0], _status(1.0))
    clock.t = 10.0
    dashboard.finished(recipe.runs[0], 0, FINISHED, "a")
    dashboard.update_run("b", recipe.runs[1], _status(1.0))
    clock.t = 15.0
    dashboard.update_run("b", recipe.runs[1], _status(10.0))
    assert dashboard.progress() == "1/3 runs done, 1 running, 15s elapsed, about 15s left"


def test_before_a_run_finishes_the_budgets_give_an_upper_bound(
        tmp_path: Path, clock: Clock) -> None:
    """Runs that may stop at their target take their budget at most: until one finishes,
    the estimate says "up to"; runs that always take their budget get "about"."""
    for stop, bound in ((True, "up to about"), (False, "about")):
        recipe = _recipe(tmp_path, stop=stop)
        dashboard = Dashboard(recipe, live=False, console=Console(file=io.StringIO()))
        clock.t = 0.0
        dashboard.study(total=3)
        dashboard.update_run("a", recipe.runs[0], _status(0.0))
        clock.t = 10.0
        dashboard.update_run("a", recipe.runs[0], _status(50.0))
        assert dashboard.progress() == (
            f"0/3 runs done, 1 running, 10s elapsed, {bound} 50s left")


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_narrow_terminal_keeps_every_running_runs_name(tmp_path: Path, width: int) -> None:
    """Twelve sweep runs side by side: figures go before the run's name does (at 40
    columns the name column had shrunk to nothing, leaving rows no one could tell apart)."""
    recipe = _recipe(tmp_path, stop=True)
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    # the plain lines go elsewhere, whole (a log's lines are not folded at the width)
    dashboard = Dashboard(recipe, live=False, console=Console(width=width, file=io.StringIO()))
    dashboard.study(total=40)
    names = [f"{recipe.runs[i % 3].name}-lr=0.0001-r{i}" for i in range(12)]
    for i, name in enumerate(names):
        dashboard.update_run(name, recipe.runs[i % 3], {
            **_status(1000.0), "time_s": 5000.0, "version": 1234, "virtual_per_real": 12.3})
    console.print(dashboard.render_study())
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    unfolded = "".join(line.split(" ")[1] if line.startswith(" ") else ""
                       for line in text.splitlines())
    for name in names:
        assert name in unfolded, text
    assert text.count("1000/5000 s") == 12  # the elapsed figure is never cut
