"""What stopped a study is what its summaries and its report say: Ctrl-C, or SIGTERM (a
`kill`, a Slurm time limit), not "Ctrl-C" for both."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from asyncsync.cli import main
from asyncsync.study.recipe import load_recipe
from asyncsync.study.runner import _terminable, run_recipe

RECIPE = """
name = "long"
baseline = "asp"

[defaults]
workers = 2
clock = "virtual"

[defaults.stop]
time_s = 1000000

[defaults.model]
name = "mlp"

[defaults.compute]
base_step_s = 0.1

[[runs]]
name = "asp"
protocol = "asp"
"""


def _signal_once_running(logs: Path, signal_number: int) -> threading.Thread:
    """A thread that sends this process `signal_number` once a run has logged events."""

    def send() -> None:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size for p in logs.glob("long/*/*/events.jsonl")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(os.getpid(), signal_number)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("ctrl_c")
@pytest.mark.parametrize(("signal_number", "cause"), [
    (signal.SIGINT, "interrupted (Ctrl-C)"),
    (signal.SIGTERM, "interrupted (SIGTERM: a kill, or a Slurm time limit or preemption)")],
    ids=["ctrl-c", "sigterm"])
def test_a_run_cut_short_names_what_stopped_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], signal_number: int,
        cause: str) -> None:
    path = tmp_path / "long.toml"
    path.write_text(RECIPE)
    logs = tmp_path / "logs"
    thread = _signal_once_running(logs, signal_number)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(_terminable(run_recipe(load_recipe(path), logs, live=False)))
    thread.join()
    (run_dir,) = logs.glob("long/*/asp")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["error"] == cause
    said = " ".join(capsys.readouterr().out.split())
    assert f"{cause}: the runs in progress are marked interrupted" in said
    assert main(["report", str(run_dir.parent)]) == 2  # nothing finished to report
    assert f"{run_dir}: left out, it was {cause}" in " ".join(capsys.readouterr().out.split())
