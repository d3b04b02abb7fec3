"""A real-clock run whose worker process is killed outright (SIGKILL: the out-of-memory
killer) fails saying so: its summary said only "worker-1 failed; see its .log", and that
log has nothing to say, the process having had no chance to write."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study import nodes
from asyncsync.study.dashboard import Dashboard
from tests.test_cli import run_main

pytestmark = pytest.mark.xdist_group("real-clock")  # starts a server and workers

RECIPE = """
name = "real"
[defaults]
workers = 2
[defaults.stop]
time_s = 600
[defaults.model]
name = "mlp"
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def test_a_worker_killed_mid_run_is_named_with_how(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    spawned: dict[str, Any] = {}
    spawn, update = nodes._spawn, Dashboard.update

    def kept(name: str, *rest: Any, **options: Any) -> Any:
        spawned[name] = spawn(name, *rest, **options)
        return spawned[name]

    def kill_at_first_status(self: Dashboard, *given: Any) -> None:
        worker = spawned["worker-1"].process
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGKILL)
        update(self, *given)

    monkeypatch.setattr(nodes, "_spawn", kept)
    monkeypatch.setattr(Dashboard, "update", kill_at_first_status)
    (tmp_path / "real.toml").write_text(RECIPE)
    code, out = run_main(capsys, "run", str(tmp_path / "real.toml"), "--plain", "--logs",
                         str(tmp_path / "logs"))
    assert code == 1 and "Traceback" not in out, out
    (summary,) = (tmp_path / "logs" / "real").glob("*/bsp/summary.json")
    assert json.loads(summary.read_text())["error"] == (
        "worker-1 was killed by SIGKILL (the out-of-memory killer, or kill -9); see its .log "
        "in the run directory")
