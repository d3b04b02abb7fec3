"""The server and workers `asyncsync run` started stop when it is killed outright (SIGKILL,
the OOM killer): it cannot stop them then, and they trained on, unwatched, until the
run's time was up (in a kernel-shaped run, inside namespaces nobody would remove before
the next start). A node started by hand does not watch its parent (a shell may go).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsync.study.launch import SUPERVISOR_ENV
from asyncsync.study.nodes import node_env

ROOT = Path(__file__).parents[1]
RECIPE = """
name = "orphans"
[defaults]
workers = 2
[defaults.stop]
time_s = 300
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 5.0
[[runs]]
name = "asp"
protocol = "asp"
"""


def _nodes_of(folder: Path) -> list[int]:
    """The pids of processes whose command line names `folder` (the run's nodes)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and str(folder).encode() in command:
            found.append(int(entry.name))
    return found


def test_a_supervisor_marks_its_nodes_as_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUPERVISOR_ENV, "1-1")  # inherited from elsewhere: replaced
    stat = Path("/proc/self/stat").read_text()  # this process's start: field 22
    me = f"{os.getpid()}-{stat[stat.rindex(')') + 2:].split()[19]}"
    assert node_env("secret", server=True)[SUPERVISOR_ENV] == me
    assert node_env("secret", server=False)[SUPERVISOR_ENV] == me


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("killed_when", ["worker-1.log", "worker-1.jsonl"])
def test_nodes_stop_when_their_supervisor_is_killed(tmp_path: Path, killed_when: str) -> None:
    # worker-1.log: the workers were just started (still importing); .jsonl: they work.
    recipe, logs = tmp_path / "orphans.toml", tmp_path / "logs"
    recipe.write_text(RECIPE)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "asyncsync", "run", str(recipe), "--logs", str(logs),
         "--plain"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 240
    while not list(logs.glob(f"orphans/*/asp/{killed_when}")) and \
            supervisor.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    nodes = [pid for pid in _nodes_of(logs) if pid != supervisor.pid]
    assert len(nodes) == 3, nodes  # the server and two workers, running
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    deadline = time.monotonic() + 90  # (the run had 300 s to go)
    while _nodes_of(logs) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _nodes_of(logs)
    for pid in left:  # (before the fix: end them, and fail)
        os.kill(pid, signal.SIGKILL)
    assert left == []
