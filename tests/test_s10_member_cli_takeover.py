"""A worker process whose rank a newer worker took over mid-run stops with one ``error:``
line naming the takeover (exit 2), not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_cli import one_error
from tests.test_node_errors import start_server

pytestmark = pytest.mark.xdist_group("real-clock")  # starts server and worker processes

RECIPE = """
[defaults]
workers = 1
[defaults.stop]
time_s = 600
[defaults.model]
name = "mlp"
[[runs]]
name = "net"
protocol = "asp"
"""


def test_a_worker_taken_over_mid_run_is_one_error_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    env = {**os.environ, "ASYNCSYNC_TOKEN": "aaa", "OMP_NUM_THREADS": "1"}
    server, url = start_server(recipe, tmp_path / "logs", {"ASYNCSYNC_TOKEN": "aaa"})
    command = [sys.executable, "-m", "asyncsync", "worker", "--recipe", str(recipe),
               "--server", url, "--rank", "0"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=env, text=True)
    later = None
    try:
        events = tmp_path / "logs" / "events.jsonl"
        deadline = time.monotonic() + 120
        while not (events.exists() and '"join"' in events.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.stdout
            time.sleep(0.2)
        later = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
        out, _ = first.communicate(timeout=120)
        error = one_error((first.returncode, out))
    finally:
        for process in (first, later, server):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert error.startswith(f"error: the server at {url} refused worker 0 mid-run (403: "
                            "worker 0: this session was taken over by a newer join"), error
