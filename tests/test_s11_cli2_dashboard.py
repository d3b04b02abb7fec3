"""The study's live view in a narrow terminal with short run names (the usual `bsp`,
`asp`): every name shown, and no figure cut."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync.study.dashboard import Dashboard
from tests.test_s9_study_dashboard import _recipe, _status


@pytest.mark.parametrize("width", [30, 40, 44, 50, 60])
def test_a_narrow_terminal_keeps_short_names_and_whole_figures(tmp_path: Path,
                                                              width: int) -> None:
    """At 40 columns the table came out two columns wider than the terminal (its edges
    were not counted), so rich shrank the name column to nothing and cut the speed."""
    recipe = _recipe(tmp_path, stop=False)
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    dashboard = Dashboard(recipe, live=False, console=console)
    dashboard.console = Console(width=width, file=io.StringIO())  # (its plain lines)
    dashboard.study(total=3)
    for spec in recipe.runs:
        dashboard.update_run(spec.name, spec, {**_status(1.0), "time_s": 3.0,
                                               "version": 18, "virtual_per_real": 7.5})
    console.print(dashboard.render_study().renderables[1])  # the runs, under the bar
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert all(len(line) <= width for line in lines)
    header = lines[0].split()
    assert header[0] == "run", lines
    rows = lines[2:]
    assert [row.split()[0] for row in rows] == ["a", "b", "c"], lines
    for row in rows:  # every figure shown whole, or its column not at all
        assert ("1/3 s" in row) == ("elapsed" in header), lines
        assert ("7.5x" in row) == ("speed" in header), lines
        assert len(row.split()) == len(header) + ("elapsed" in header), lines
