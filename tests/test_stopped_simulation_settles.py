"""A virtual run stopped from its status sink (Ctrl-C, SIGTERM) leaves no task pending.

The sink raises inside the loop's time jump, out of `run_until_complete`; the server's and
the workers' tasks were then destroyed pending when the loop was collected ("Task was
destroyed but it is pending!", "Event loop is closed"). They are now cancelled and awaited
before the loop closes.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

RECIPE = """
name = "stopped"
[defaults]
workers = 3
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 0.1
[defaults.stop]
time_s = 50
[defaults.compute]
base_step_s = 0.02
[[runs]]
name = "asp"
protocol = "asp"
"""


class Stop(Exception):
    """What the sink raises to stop the run."""


def test_a_run_stopped_by_its_sink_ends_its_tasks(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    recipe = tmp_path / "stopped.toml"
    recipe.write_text(RECIPE)
    spec = load_recipe(recipe).run("asp")

    def sink(status: dict[str, Any]) -> None:
        if status["elapsed_s"] >= 2:
            raise Stop

    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(Stop):
        simulate(spec, tmp_path, "stopped/asp", sink)
    gc.collect()
    destroyed = [r.getMessage() for r in caplog.records if "destroyed" in r.getMessage()]
    assert destroyed == []
