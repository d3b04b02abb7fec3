"""A server started without --resume on a --log-dir that holds a run's logs is refused
with one ``error:`` line and leaves the folder as it was: it appended a second run to
events.jsonl, and the summary then mixed the two (the first run's versions, both runs'
evaluations, restarting at t = 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import one_error, run_main
from tests.test_trialn_foreign_server import RECIPE  # one worker, the mlp, asp


def test_a_used_log_dir_needs_resume(capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    logs = tmp_path / "logs"
    logs.mkdir()
    old = {"events.jsonl": '{"event":"start","t":0.0}\n', "recipe.json": "{}",
           "summary.json": '{"versions": 7}'}
    for name, text in old.items():
        (logs / name).write_text(text)
    line = one_error(run_main(capsys, "server", "--recipe", str(recipe), "--port", "0",
                              "--log-dir", str(logs)))
    assert f"--log-dir {logs} holds a run's logs already" in line and "--resume" in line
    assert {path.name: path.read_text() for path in logs.iterdir()} == old
