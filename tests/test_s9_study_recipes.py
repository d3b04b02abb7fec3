"""Malformed recipes and ``--set`` values: one ``error:`` line naming the file, the key and
the problem, exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.study.recipe import load_recipe
from tests.test_cli import one_error, run_main

RECIPE = """
name = "tiny"
baseline = "bsp"

[defaults]
workers = 2
clock = "virtual"

[defaults.stop]
time_s = 5

[defaults.model]
name = "mlp"

[[runs]]
name = "bsp"
protocol = "bsp"
"""


def _recipe(tmp_path: Path, text: str = RECIPE) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def test_stop_at_target_without_a_target_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was accepted, then `check` crashed formatting the missing target."""
    path = _recipe(tmp_path)
    assert one_error(run_main(capsys, "check", str(path), "--set",
                              "stop.stop_at_target=true")) == (
        f"error: {path}: runs[0] (bsp): stop.stop_at_target: there is no target to stop at; "
        "set stop.target_accuracy too")
    (run,) = load_recipe(path, ["stop.stop_at_target=true", "stop.target_accuracy=0.5"]).runs
    assert run.stop.stop_at_target and run.stop.target_accuracy == 0.5


def test_every_option_of_every_verb_says_what_it_does() -> None:
    """`server`, `worker` and `launch` listed --recipe and --log-dir with no word on them."""
    import argparse

    from asyncsync.cli import _parser

    (verbs,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [f"{verb} {action.dest}" for verb, parser in verbs.choices.items()
              for action in parser._actions
              if not isinstance(action, argparse._HelpAction) and not action.help]
    assert silent == []


@pytest.mark.parametrize(("runs", "said"), [
    ("runs = 5", "runs: expected [[runs]] tables, got 5"),
    ('runs = "bsp"', "runs: expected [[runs]] tables, got 'bsp'"),
    ("runs = []", "runs: a recipe needs at least one [[runs]] table")])
def test_runs_that_are_no_list_of_tables_say_what_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], runs: str, said: str) -> None:
    path = _recipe(tmp_path, f'name = "x"\n{runs}\n')
    assert one_error(run_main(capsys, "check", str(path))) == f"error: {path}: {said}"
