"""`asyncsync report` on odd studies, as a user would try it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.test_plots import repeats


def test_a_sweep_of_one_value_gets_no_sweep_plot(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One swept value: sweep.png was a single dot per run on an x axis from 0.096 to
    0.104; two values still get it."""
    pytest.importorskip("matplotlib")
    from asyncsync.results import plots

    monkeypatch.setattr(plots, "plot_timeline", lambda run_dir, path, name, clock: path)
    for values in ([0.1], [0.1, 0.3]):
        summaries: list[dict[str, Any]] = []
        for lr in values:
            for run in ("bsp", "asp"):
                summaries += repeats(f"{run}@optim.lr={lr}", [2.0, 3.0],
                                     sweep={"optim.lr": lr})
        out = tmp_path / str(len(values))
        out.mkdir()
        names = {f.name for f in plots.write_plots([tmp_path] * len(summaries), summaries,
                                                   out, "bsp")}
        assert ("sweep.png" in names) == (len(values) == 2)
        assert "time_to_target.png" in names


def test_a_nan_accuracy_is_no_accuracy(tmp_path: Path) -> None:
    """An evaluation whose accuracy is NaN (a custom evaluator's 0/0): the best accuracy
    was NaN when it came first (max keeps a leading NaN: '-' in the table, 'nan' in
    table.csv), the final accuracy NaN, and summary.json not JSON (``NaN``)."""
    from asyncsync.results.report import summarize_run
    from asyncsync.study.executors import write_summary
    from tests.test_report import fake_run

    run_dir = fake_run(tmp_path, "r", "a", "asp", [0.5, 0.3, 0.6, 0.4])
    events = run_dir / "events.jsonl"
    lines = events.read_text().splitlines()
    for index in (0, 3):  # the first and the last evaluation
        record = json.loads(lines[index])
        record["accuracy"] = math.nan
        lines[index] = json.dumps(record)  # Python writes NaN as the server's json does
    events.write_text("\n".join(lines) + "\n")
    summary = summarize_run(run_dir)
    assert summary["best_accuracy"] == 0.6  # of 0.3 and 0.6
    assert summary["final_accuracy"] is None
    assert summary["time_to_target_s"] == 4.0  # the first evaluation >= 0.5: at t = 2 * 2
    write_summary(run_dir, summary)

    def refuse(name: str) -> None:
        raise AssertionError(f"summary.json has {name}, which JSON has not")

    written = json.loads((run_dir / "summary.json").read_text(), parse_constant=refuse)
    assert written["evaluations"][0] == [0.0, None]


def test_the_accuracy_plot_leaves_out_an_evaluation_without_accuracy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.json's evaluations have null for a NaN accuracy: the accuracy plot drew
    them and raised (numpy cannot interpolate None); a run with none left has no line."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from asyncsync.results import plots

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at it
    summaries = repeats("bsp", [4.0]) + repeats("asp", [4.0]) + repeats("ssp", [None])
    summaries[0]["evaluations"] = [[0.0, None], [2.0, 0.4], [4.0, 0.75]]
    summaries[2]["evaluations"] = [[0.0, None]]
    plots.plot_accuracy(summaries, tmp_path / "a.png", ["bsp", "asp", "ssp"])
    (axes,) = figures[0].axes
    curves = {tuple(line.get_xdata()): list(line.get_ydata()) for line in axes.lines
              if line.get_linestyle() != "--" and len(line.get_xdata()) > 1}
    assert curves[(2.0, 4.0)] == [0.4, 0.75]  # bsp: from its first accuracy
    assert curves[(0.0, 2.0, 4.0)] == [0.1, 0.4, 0.75]  # asp as written
    assert len(curves) == 2  # none for ssp
