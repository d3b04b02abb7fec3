"""The timeline's legend names every kind of span, whichever worker drew it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from asyncsync.results import timeline
from asyncsync.runlog.schema import KEY, Kind

pytest.importorskip("matplotlib")


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_legend_does_not_depend_on_the_first_row_being_busy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 0 was never online (a population's usual first row): its row is empty, and
    the legend was empty too (matplotlib warned 'No artists with labels')."""
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its legend
    final = {KEY: Kind.FINAL, "steps": 4, "compute_s": 2.0, "wall_s": 10.0}
    _write(tmp_path / "worker-0.jsonl", [{**final, "steps": 0, "compute_s": 0.0}])
    busy = [{KEY: Kind.COMPUTE, "t": 2.0 + 2 * i, "dur": 1.0} for i in range(4)]
    busy += [{KEY: Kind.PULL, "t": 3.0 + 2 * i, "dur": 1.0, "held_s": 0.5} for i in range(4)]
    _write(tmp_path / "worker-1.jsonl", [*busy, final])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timeline.plot_timeline(tmp_path, tmp_path / "timeline.png", "run", "virtual")
    monkeypatch.undo()
    (figure,) = figures
    entries = [text.get_text() for text in figure.legends[0].get_texts()]
    assert entries == ["compute", "communicate", "held"]
    plt.close(figure)
