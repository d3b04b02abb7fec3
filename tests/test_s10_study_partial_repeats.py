"""A run of which only some repeats reached the target: its time to target is the mean of
those, and both the table and the sweep plot say so (the table printed ``3.0±12.7 (2/3)``
and no word on what ``(2/3)`` meant; the sweep plot drew the mean with no mark at all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncsync.results import plots, pyplot
from asyncsync.runlog.reading import sweep_suffix
from tests.test_cli import run_main
from tests.test_report import fake_run
from tests.test_report_unfinished import flat
from tests.test_s8_results_plots import _drawn


def test_the_table_says_what_k_of_n_repeats_means(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "write_plots", lambda *args: [])
    for repeat in (0, 1, 2):  # evaluations every 2 s, target 0.5
        study = fake_run(tmp_path, "r", "bsp", "bsp", [0.1, 0.6], repeat=repeat).parent
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.7], repeat=0)  # reached at 2 s
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.4, 0.7], repeat=1)  # at 4 s
    fake_run(tmp_path, "r", "asp", "asp", [0.2, 0.3], repeat=2)  # never
    code, out = run_main(capsys, "report", str(study), "--baseline", "bsp")
    assert code == 0, out
    (asp,) = [line for line in out.splitlines() if line.startswith(" asp ")]
    # mean of 2 and 4 s; half-width t(1 df) 12.706 x sd 1.414 / sqrt(2) = 12.7: from
    # 3 - 12.7 < 0 (shown as 0) to 15.7
    assert asp.split()[2:5] == ["3.0", "[0.0,", "15.7]"] and asp.split()[5] == "(2/3)", out
    assert ("(k/n): over the k of n repeats that have the figure; a time to target or a "
            "speedup only where the repeat reached the target, so over all n the times "
            "would be longer") in flat(out), out


def _summary(run: str, slowdown: list[int], repeat: int, time_to_target: float | None
             ) -> dict[str, Any]:
    sweep = {"compute.slowdown": slowdown}
    return {"recipe": "r", "run": run + sweep_suffix(sweep), "protocol": run,
            "repeat": repeat, "sweep": sweep, "clock": "virtual", "wall_s": 10.0,
            "target_accuracy": 0.5, "time_to_target_s": time_to_target,
            "compute_proportion": 0.5}


@pytest.mark.skipif(not pyplot.matplotlib_available(), reason="needs matplotlib")
def test_the_sweep_plot_marks_a_point_over_part_of_the_repeats(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summaries = [_summary("bsp", [1, 3], r, 6.0) for r in (0, 1, 2)]
    summaries += [_summary("asp", [1, 3], 0, 2.0), _summary("asp", [1, 3], 1, 4.0),
                  _summary("asp", [1, 3], 2, None)]
    summaries += [_summary("bsp", [1, 2], r, 4.0) for r in (0, 1, 2)]
    summaries += [_summary("asp", [1, 2], r, 2.0) for r in (0, 1, 2)]
    figure = _drawn(monkeypatch, summaries, tmp_path / "sweep.png")
    for panel in (0, 1):  # time to target: mean 3 s; speedup: mean of 6/2 and 6/4
        notes = [(text.get_text(), text.xy) for text in figure.axes[panel].texts]
        assert notes == [("2/3", (0.0, 3.0 if panel == 0 else 2.25))], notes
    assert list(figure.axes[2].texts) == []  # every repeat has a compute proportion
