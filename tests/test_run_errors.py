"""A run that fails is tabled with its own error, whichever way it was run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncsync.cli import main

RECIPE = """
name = "broken"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 1
[defaults.model]
name = "mlp"
options = { no_such_option = 1 }
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def test_a_virtual_run_that_fails_at_set_up_reports_its_own_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One job: the run's thread raised before it wrote a log (its model refused its
    options; a model that cannot be imported is refused before any run starts); its error,
    not the missing log's, is the run's (it was a FileNotFoundError of events.jsonl)."""
    recipe = tmp_path / "broken.toml"
    recipe.write_text(RECIPE)
    assert main(["run", str(recipe), "--jobs", "1", "--plain", "--logs",
                 str(tmp_path / "logs")]) == 1
    (summary,) = (tmp_path / "logs").glob("broken/*/bsp/summary.json")
    error = json.loads(summary.read_text())["error"]
    assert "model 'mlp' rejected its options" in error
    assert "events.jsonl" not in capsys.readouterr().out
