"""The single-run panel (``--jobs 1``) of a recipe that repeats its runs says which repeat
is running, live and in plain lines."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncsync.study.dashboard import Dashboard
from asyncsync.study.recipe import load_recipe
from asyncsync.study.run_one import run_and_record

RECIPE = """
name = "again"
baseline = "a"
repeats = 3
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 2
[defaults.model]
name = "mlp"
[defaults.data]
name = "synthetic"
[defaults.compute]
base_step_s = 0.05
[[runs]]
name = "a"
protocol = "asp"
"""


class Shown(Dashboard):
    """A dashboard that keeps the text of every panel and plain line it shows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.texts: list[str] = []

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        if self._live is not None:
            probe = Console(width=100, record=True, color_system=None)
            probe.print(self._live.renderable)
            self.texts.append(probe.export_text())


def test_the_panel_of_one_run_names_its_repeat(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "r.toml")
    (spec,) = recipe.runs
    live = Shown(recipe, live=True, console=Console(file=io.StringIO(), width=100))
    with live:
        summary = asyncio.run(run_and_record(recipe.repeated(spec)[1], recipe,
                                             tmp_path / "a-r1", live, 0, 1))
    assert "error" not in summary
    assert live.texts and all("run 1/1, repeat 2/3 a " in text for text in live.texts)
    plain = io.StringIO()
    lines = Dashboard(recipe, live=False, console=Console(file=plain, width=200))
    lines.update(spec, 0, {**live_status(), "started": True}, 2)
    assert plain.getvalue().startswith("[a repeat 3/3] t=1s")


def live_status() -> dict[str, Any]:
    return {"version": 1, "accuracy": None, "best_accuracy": None, "elapsed_s": 1.0,
            "time_s": 2.0, "workers": []}
