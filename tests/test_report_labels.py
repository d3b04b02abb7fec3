"""A report keeps the recipe's order in its table, CSV and plot colours; it warns when
too few repeats make its intervals very wide and never draws a negative whisker; its title
names no baseline that did not run; piped output keeps to COLUMNS, but never folds a
path."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync import cli
from asyncsync.results import plots
from asyncsync.results.report import comparison_table, make_console
from tests.test_report import fake_run

CURVES = {"bsp": [0.1, 0.3, 0.45, 0.6], "asp": [0.1, 0.55, 0.65, 0.7]}


def repeats_study(root: Path) -> Path:
    """bsp then asp (the recipe's order, against the alphabet), 2 repeats each."""
    for name, curve in CURVES.items():
        for repeat in range(2):
            fake_run(root, "order", name, name, curve, repeat=repeat)
    study = root / "order" / "20260101-000000"
    (study / "recipe.json").write_text(json.dumps(
        {"name": "order", "baseline": "bsp", "repeats": 2,
         "runs": [{"name": name, "protocol": {"name": name}} for name in CURVES]}))
    return study


def test_report_keeps_the_recipes_order_and_colours(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figures to read colours
    study = repeats_study(tmp_path)
    assert cli.main(["report", str(study)]) == 0
    out = capsys.readouterr().out
    assert out.index(" bsp ") < out.index(" asp ")
    with (study / "table.csv").open() as table:
        assert [row["run"] for row in csv.DictReader(table)] == [
            "bsp", "bsp", "asp", "asp"]
    accuracy = next(f for f in figures if "Accuracy" in f.axes[0].get_title())
    colours = {line.get_label(): line.get_color() for line in accuracy.axes[0].get_lines()
               if line.get_label() in CURVES}
    legend = {text.get_text(): handle.get_color() for text, handle in zip(
        accuracy.axes[0].get_legend().get_texts(),
        accuracy.axes[0].get_legend().legend_handles, strict=True)
        if text.get_text() in CURVES}
    assert legend == {"bsp": "C0", "asp": "C1"}, (legend, colours)
    highest = max(max(curve) for curve in CURVES.values())
    assert accuracy.axes[0].get_ylim()[1] > highest  # every band whole


def test_too_few_repeats_warn_and_whiskers_stop_at_zero(tmp_path: Path) -> None:
    summaries = [{"recipe": "r", "run": "bsp", "protocol": "bsp", "repeat": k, "seed": k,
                  "sweep": {}, "clock": "virtual", "target_accuracy": 0.7,
                  "time_to_target_s": t, "evaluations": [[0, 0.1], [t, 0.7]]}
                 for k, t in enumerate([5.0, 20.0])]
    console = Console(width=100, record=True, color_system=None)
    console.print(comparison_table(summaries, "bsp", "r", 100))
    text = " ".join(console.export_text().split())
    assert "with 2 repeats the 95% intervals are very wide" in text
    bars = plots.plot_time_to_target(summaries, tmp_path / "ttt.png", ["bsp", "bsp"])
    assert bars.heights == [12.5] and bars.bottoms == [0.0]
    assert bars.errors[0] is not None and bars.errors[0] > 12.5  # the interval, above


def test_the_title_names_no_baseline_that_did_not_run(tmp_path: Path) -> None:
    asp = [{"recipe": "r", "run": "asp", "protocol": "asp", "repeat": 0, "seed": 0,
            "sweep": {}, "clock": "virtual", "target_accuracy": 0.7, "time_to_target_s": 3.0,
            "evaluations": [[0, 0.1], [3, 0.7]]}]
    console = Console(width=200, record=True, color_system=None)
    console.print(comparison_table(asp, "bsp", "quickstart", 200))
    text = console.export_text()
    assert "baseline bsp" not in text
    assert "quickstart: comparison (no baseline: bsp did not run)" in text


def test_piped_output_keeps_to_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert make_console().width == 80
    study = repeats_study(tmp_path)
    assert cli.main(["report", str(study)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(len(line) for line in lines if not line.startswith("wrote ")) <= 80
    wrote = [line.removeprefix("wrote ") for line in lines if line.startswith("wrote ")]
    assert len(wrote) >= 3 and len(max(wrote, key=len)) > 80
    for path in wrote:  # each a whole path (the terminal, not the report, folds it)
        assert Path(path).is_file(), path
