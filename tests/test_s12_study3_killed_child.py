"""A ``--jobs`` child killed outright in the middle of its run (the kernel's out-of-memory
killer sends SIGKILL): the run's folder gets a summary.json saying so, which ``report``
names and ``--resume`` runs again. It had none, so ``report`` could say only "no
summary.json yet (not started, still running, or killed)", and the table said "its process
ended with status -9: no output"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study import children
from asyncsync.study.dashboard import Dashboard
from tests.test_cli import run_main
from tests.test_s12_study3_jobs_tracker import RECIPE

KILLED = "interrupted: its process was killed by SIGKILL (the out-of-memory killer, or kill -9)"


def test_a_child_killed_mid_run_is_recorded_with_why(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    spawn, update_run = children.spawn, Dashboard.update_run

    def kept() -> subprocess.Popen[bytes]:
        spawned.append(spawn())
        return spawned[-1]

    def kill_at_first_status(self: Dashboard, name: str, *rest: Any) -> None:
        for process in spawned:  # both children, each in the middle of its run
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
        update_run(self, name, *rest)

    monkeypatch.setattr(children, "spawn", kept)
    monkeypatch.setattr(Dashboard, "update_run", kill_at_first_status)
    (tmp_path / "small.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain", "--jobs",
                         "2", "--logs", str(tmp_path / "logs"))
    assert code == 1 and "Traceback" not in out, out  # runs that did not finish
    assert "status -9" not in out, out
    (study,) = (tmp_path / "logs" / "small").iterdir()
    for run in ("bsp-r0", "bsp-r1"):
        summary = json.loads((study / run / "summary.json").read_text())
        assert summary["interrupted"] is True, run
        assert summary["error"].startswith(KILLED), summary["error"]

    code, out = run_main(capsys, "report", str(study))
    flat = " ".join(out.split())
    assert code == 2, out
    assert f"{study / 'bsp-r0'}: left out, it was {KILLED}" in flat, out
    assert "no summary.json yet" not in flat, out
