"""The sweep plot of a sweep over lists (``compute.slowdown = [[1, 3], [1, 2]]``): its
values side by side in the recipe's order, each labelled as the recipe writes it (it
failed: a list is not a number on an axis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncsync.results import pyplot
from asyncsync.runlog.reading import sweep_suffix
from tests.test_s8_results_plots import _drawn

pytestmark = pytest.mark.skipif(not pyplot.matplotlib_available(), reason="needs matplotlib")


def _summary(run: str, slowdown: list[int], time_to_target: float) -> dict[str, Any]:
    sweep = {"compute.slowdown": slowdown}
    return {"recipe": "r", "run": run + sweep_suffix(sweep), "protocol": run, "repeat": 0,
            "sweep": sweep, "clock": "virtual", "wall_s": 10.0, "target_accuracy": 0.5,
            "time_to_target_s": time_to_target, "compute_proportion": 0.5}


def test_list_values_stand_side_by_side_labelled(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    summaries = [_summary("bsp", [1, 3], 6.0), _summary("asp", [1, 3], 2.0),
                 _summary("bsp", [1, 2], 4.0), _summary("asp", [1, 2], 2.0)]
    figure = _drawn(monkeypatch, summaries, tmp_path / "sweep.png")
    speedup = figure.axes[1]
    assert [tick.get_text() for tick in speedup.get_xticklabels()] == ["[1, 3]", "[1, 2]"]
    asp = next(line for line in speedup.get_lines() if line.get_marker() == "o"
               and list(line.get_ydata()) == [3.0, 2.0])
    assert list(asp.get_xdata()) == [0.0, 1.0]
