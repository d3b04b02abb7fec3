"""The README's commands run as written from a fresh clone (tiny budgets through --set)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TINY = ["--set", "workers=2", "--set", "compute.slowdown=[1, 2]", "--set", "stop.time_s=2",
        "--set", "eval.interval_s=1", "--set", "compute.base_step_s=0.05", "--clock",
        "virtual", "--plain"]
"""Appended to each `run`: two workers for 2 virtual seconds of paced 50 ms steps, in one
process (a later option wins; test_e2e runs the real clock's processes)."""


def readme_commands() -> list[list[str]]:
    """The `asyncsync ...` lines of the README's "Running recipes" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Running recipes")[1].split("```bash")[1].split("```")[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


@pytest.mark.timeout(900)  # seven commands, each starting a Python with torch
def test_the_running_recipes_commands_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    commands = readme_commands()
    assert [c[:2] for c in commands][-3:] == [["asyncsync", "check"],
                                              ["asyncsync", "protocols"],
                                              ["asyncsync", "report"]]
    env = {**os.environ, "COLUMNS": "100"}
    outputs = []
    for command in commands:
        assert command[0] == "asyncsync", command
        args = command[1:]
        if args[0] == "run":
            args += ["--only", "asp"] if "--only" not in args else []
            args += TINY
        done = subprocess.run([sys.executable, "-m", "asyncsync", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        outputs.append(done.stdout)
    runs = [c for c in commands if c[1] == "run"]
    assert len(list((tmp_path / "logs" / "quickstart").iterdir())) == len(runs)
    report = outputs[-1]
    assert f"holds {len(runs)} studies: reporting the latest" in report
    assert "quickstart: comparison (baseline asp)" in report  # the last run was --only asp
