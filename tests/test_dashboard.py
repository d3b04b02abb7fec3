"""The live panel renders every worker's figures legibly in an 80-column terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.hetero.network import LinkSpec
from asyncsync.study import dashboard as dashboard_module
from asyncsync.study.dashboard import Dashboard, condensed, link_label
from asyncsync.study.recipe import load_recipe

RECIPES = Path(__file__).parent.parent / "recipes"


def status(overruns: int) -> dict[str, Any]:
    return {
        "version": 123, "accuracy": 0.5, "best_accuracy": 0.6, "elapsed_s": 12.0,
        "time_s": 50.0, "stopping": False,
        "workers": [{"rank": rank, "state": "waiting" if rank else "computing",
                     "steps": 1234, "samples_per_s": 456.0, "compute_proportion": 0.5,
                     "bytes_up": 123_456_789, "bytes_down": 23_456_789, "loss": 0.123,
                     "factor": 1.5, "overruns": overruns} for rank in range(4)],
    }


def test_panel_shows_every_worker_in_80_columns() -> None:
    recipe = load_recipe(RECIPES / "wan.toml")
    console = Console(width=80, record=True, color_system=None)
    dashboard = Dashboard(recipe, live=False, console=console)
    console.print(dashboard.render(recipe.runs[0], 0, status(overruns=7)))
    text = console.export_text()
    assert "run 1/5 bsp" in text and "version 123" in text and "elapsed 12/50 s" in text
    rows = [line for line in text.splitlines() if "20/20M 40ms" in line]
    assert len(rows) == 4
    assert all("1.5x" in row and "123.5" in row and "50%" in row and " 7" in row
               for row in rows)
    assert "computing" in rows[0] and "waiting" in rows[1]
    assert "…" not in text  # nothing truncated


def test_plain_line_and_link_labels() -> None:
    recipe = load_recipe(RECIPES / "quickstart.toml")
    line = Dashboard.plain_line(recipe.runs[0], {**status(overruns=2), "version": 9})
    assert line.startswith("[bsp] t=12s v=9 acc=0.500")
    assert "w3:wait/1234st/50%/2overruns" in line
    assert link_label(LinkSpec()) == "-"
    assert link_label(LinkSpec(10, 0, 25, 5)) == "10/infM 25~5ms"


def test_a_virtual_run_shows_virtual_time_and_its_speed() -> None:
    recipe = load_recipe(RECIPES / "quickstart.toml")
    line = Dashboard.plain_line(recipe.runs[0], {**status(overruns=0), "version": 9,
                                                 "virtual_per_real": 2.5})
    assert line.startswith("[bsp] t=12s virtual (2.5x real time) v=9")
    console = Console(width=80, record=True, color_system=None)
    console.print(Dashboard(recipe, live=False, console=console).render(
        recipe.runs[0], 0, {**status(overruns=0), "virtual_per_real": 0.4}))
    assert "virtual (0.4x real time)" in " ".join(console.export_text().split())


def test_hundreds_of_workers_are_summarised_by_state() -> None:
    recipe = load_recipe(RECIPES / "quickstart.toml")
    many = {**status(overruns=1), "virtual_per_real": 3.0}
    many["workers"] = [{**w, "rank": rank, "factor": 1.0 + rank % 4,
                        "state": "waiting" if rank % 3 else "computing"}
                       for rank, w in enumerate(many["workers"] * 75)]  # 300 workers
    console = Console(width=80, record=True, color_system=None)
    console.print(Dashboard(recipe, live=False, console=console).render(
        recipe.runs[0], 0, many))
    text = console.export_text()
    rows = [line.split() for line in text.splitlines()]
    computing = next(row for row in rows if "computing" in row)
    waiting = next(row for row in rows if "waiting" in row)
    # ranks 0, 3, 6, ... compute (100 of them), the other 200 wait; slowdowns span 1-4x
    assert computing[:2] == ["100x", "1.0-4.0x"] and waiting[:2] == ["200x", "1.0-4.0x"]
    assert computing[-1] == "100" and waiting[-1] == "200"  # overruns summed
    assert len(text.splitlines()) < 12
    line = Dashboard.plain_line(recipe.runs[0], many)
    assert line.endswith("computing:100 waiting:200")
    # what a child sends its supervisor: the rows by state, which show the same
    sent = json.loads(json.dumps(condensed(many)))
    assert len(json.dumps(sent)) < len(json.dumps(many)) / 20
    assert Dashboard.plain_line(recipe.runs[0], sent) == line
    again = Console(width=80, record=True, color_system=None)
    again.print(Dashboard(recipe, live=False, console=again).render(recipe.runs[0], 0, sent))
    assert again.export_text() == text


def test_the_panel_shows_the_runs_last_evaluation_when_it_ends() -> None:
    """The summary's best 0.602 came from an evaluation after the last status (best 0.6)."""
    recipe = load_recipe(RECIPES / "quickstart.toml")
    dashboard = Dashboard(recipe, live=True, console=Console(file=io.StringIO(), width=80))
    probe = Console(width=80, record=True, color_system=None)
    with dashboard:
        dashboard.update(recipe.runs[0], 0, status(overruns=0))
        dashboard.finished(recipe.runs[0], 0, {"best_accuracy": 0.602, "final_accuracy": 0.59,
                                               "time_to_target_s": None,
                                               "compute_proportion": 0.5})
        assert dashboard._live is not None
        probe.print(dashboard._live.renderable)
    assert "accuracy 0.590 (best 0.602" in probe.export_text()


def test_the_time_left_counts_the_runs_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs side by side: one finished at 38 s, the other has used 30 of its 50 s, so
    about 0.4 run is left at 38 s per 1.6 runs (it said 38 s, one run's time, and rose
    with every second)."""
    clock = iter([0.0, 0.0, 38.0])  # made, study started, asked
    monkeypatch.setattr(dashboard_module, "now", lambda: next(clock))
    recipe = load_recipe(RECIPES / "quickstart.toml")
    dashboard = Dashboard(recipe, live=False, console=Console(file=io.StringIO()))
    dashboard.study(total=2)
    dashboard._active["asp"] = (recipe.runs[1], {**status(0), "elapsed_s": 30.0})
    dashboard._done = 1
    assert dashboard.progress() == "1/2 runs done, 1 running, 38s elapsed, about 10s left"


@pytest.mark.parametrize(("elapsed_s", "left"), [(0.5, ""), (5.0, ", up to about 2m06s left")])
def test_the_time_left_waits_for_a_twentieth_of_a_run(
        monkeypatch: pytest.MonkeyPatch, elapsed_s: float, left: str) -> None:
    """14 s of set-up, then 1% of a 50 s budget said "up to about 23m06s left"; at 10%: 14 s /
    0.1 run x 0.9 run = 126 s."""
    clock = iter([0.0, 0.0, 14.0])  # made, study started, asked
    monkeypatch.setattr(dashboard_module, "now", lambda: next(clock))
    recipe = load_recipe(RECIPES / "quickstart.toml")
    dashboard = Dashboard(recipe, live=False, console=Console(file=io.StringIO()))
    dashboard.study(total=1)
    dashboard._active["bsp"] = (recipe.runs[0], {**status(0), "elapsed_s": elapsed_s})
    assert dashboard.progress() == f"0/1 runs done, 1 running, 14s elapsed{left}"


def test_a_run_whose_batching_fell_back_says_so_in_its_line() -> None:
    """A study's child process's warning is not shown, so the run's line says it."""
    recipe = load_recipe(RECIPES / "quickstart.toml")
    console = Console(width=200, record=True, color_system=None)
    dashboard = Dashboard(recipe, live=False, console=console)
    result = {"best_accuracy": 0.6, "final_accuracy": 0.6, "time_to_target_s": None,
              "compute_proportion": 0.5, "worker_math": "one-by-one",
              "worker_math_reason": "a batched gradient failed (RuntimeError: x)"}
    dashboard.finished(recipe.runs[0], 0, result)
    dashboard.finished(recipe.runs[1], 1, {**result, "worker_math_fallback": True})
    first, second = console.export_text().strip().splitlines()
    assert "one by one" not in first
    assert second.endswith("(steps ran one by one: a batched gradient failed "
                           "(RuntimeError: x))")
