"""The Slurm supervisor asks a task's state (submitit's ``job.state``: an ``sacct`` call,
which can take seconds on a loaded cluster) off its event loop: it was asked on the loop,
which stood still meanwhile (the dashboard, Ctrl-C, the other tasks' folders)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.test_cli import run_main
from tests.test_s12_study3_jobs_tracker import RECIPE
from tests.test_s12_study3_slurm import fake_slurm


class SlowSacct:
    """A submitit job whose task ended without a summary.json; its `state` records the
    thread that asked it."""

    def __init__(self, index: int, askers: list[threading.Thread], stderr: Path) -> None:
        self.job_id = f"88_{index}"
        self.askers = askers
        self.paths = SimpleNamespace(stderr=stderr)

    @property
    def state(self) -> str:
        self.askers.append(threading.current_thread())
        return "OUT_OF_MEMORY"

    def done(self) -> bool:
        return True

    def cancel(self, check: bool = True) -> None:
        pass


def test_the_task_state_is_asked_off_the_event_loop(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    askers: list[threading.Thread] = []

    def submitted(executor: Any, dirs: list[str], *rest: Any) -> list[SlowSacct]:
        return [SlowSacct(index, askers, tmp_path / "task.err") for index in range(len(dirs))]

    fake_slurm(monkeypatch, submitted)
    (tmp_path / "small.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain", "--logs",
                         str(tmp_path / "logs"), "--executor", "slurm")
    assert code == 1, out  # both tasks ended without a summary: failed
    (study,) = (tmp_path / "logs" / "small").iterdir()
    for run in ("bsp-r0", "bsp-r1"):
        summary = json.loads((study / run / "summary.json").read_text())
        assert "(OUT_OF_MEMORY)" in summary["error"], summary
    assert len(askers) == 2, askers  # once a task
    assert threading.main_thread() not in askers, askers  # the loop runs in the main thread
