"""Where the study's output is not a terminal (a Slurm log, ``nohup ... > file``), each
status and each run's result is one line, however long: they were folded at the console's
width, so twelve workers' figures came out over several lines."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from asyncsync.study import dashboard as dashboard_module
from asyncsync.study.dashboard import Dashboard
from asyncsync.study.recipe import load_recipe

RECIPES = Path(__file__).parent.parent / "recipes"
WIDTH = 150
"""What `asyncsync.results.layout.make_console` gives output that is not a terminal."""


def twelve_workers() -> dict[str, Any]:
    """A run's status with 12 workers, rank r at 1000 + r steps."""
    return {"started": True, "version": 4321, "accuracy": 0.5, "best_accuracy": 0.6,
            "elapsed_s": 12.0, "time_s": 50.0, "virtual_per_real": 2.5,
            "workers": [{"rank": rank, "state": "computing", "steps": 1000 + rank,
                         "samples_per_s": 1.0, "compute_proportion": 0.5, "bytes_up": 0,
                         "bytes_down": 0, "loss": 0.1, "factor": 1.0, "overruns": 0}
                        for rank in range(12)]}


def dashboard() -> tuple[Dashboard, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=WIDTH)  # a file: not a terminal
    assert not console.is_terminal
    return Dashboard(load_recipe(RECIPES / "quickstart.toml"), console=console), out


def test_a_runs_status_is_one_line() -> None:
    shown, out = dashboard()
    spec = shown.recipe.runs[0]
    shown.update(spec, 0, twelve_workers())
    (line,) = out.getvalue().splitlines()
    assert len(line) > WIDTH  # (what was folded)
    assert line.startswith("[bsp] t=12s virtual (2.5x real time) v=4321 acc=0.500 ")
    assert line.endswith(" ".join(f"w{rank}:comp/{1000 + rank}st/50%" for rank in range(12)))


def test_the_runs_in_progress_are_a_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard_module, "PLAIN_EVERY_S", 0.0)  # print at each status
    shown, out = dashboard()
    shown.study(total=4)
    for name in ("bsp-r0", "asp-r0"):
        shown.update_run(name, shown.recipe.runs[0], twelve_workers())
    lines = out.getvalue().splitlines()[2:]  # (the first status's: the progress, bsp-r0)
    assert len(lines) == 3, lines  # the study's progress, then each run's status
    assert lines[0].startswith("0/4 runs done, 2 running")
    assert [line.split()[0] for line in lines[1:]] == ["[bsp-r0]", "[asp-r0]"]
    assert all(line.endswith("w11:comp/1011st/50%") for line in lines[1:])


def test_a_runs_result_is_one_line_however_long_its_error() -> None:
    shown, out = dashboard()
    error = "a worker failed: " + "RuntimeError: CUDA out of memory. " * 8
    shown.finished(shown.recipe.runs[0], 0, {"error": error})
    (line,) = out.getvalue().splitlines()
    assert line == f"[1/{len(shown.recipe.runs)}] bsp failed: {error}"
