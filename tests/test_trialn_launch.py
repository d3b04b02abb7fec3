"""`asyncsync launch` under a real torchrun: torchrun's agent listens on MASTER_PORT (its
TCP store, TORCHELASTIC_USE_AGENT_STORE=True), so the server serves on the next port and
the workers dial it there (the server could not listen at all before)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.launch import from_environ

pytestmark = pytest.mark.xdist_group("real-clock")  # a server and workers, for seconds

RECIPE = """
name = "torchrun"
[defaults]
workers = 2
[defaults.stop]
time_s = 3
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 1.0
[[runs]]
name = "net"
protocol = "asp"
"""


def test_under_torchrun_the_server_takes_the_port_after_the_agents() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "localhost",
                "MASTER_PORT": "29500"}
    assert from_environ(torchrun).server_url == "http://localhost:29500"
    shared = from_environ({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (shared.server_port, shared.server_url) == (29501, "http://localhost:29501")
    with pytest.raises(ValueError, match="MASTER_PORT=65535"):
        from_environ({**torchrun, "MASTER_PORT": "65535",
                      "TORCHELASTIC_USE_AGENT_STORE": "True"})


def free_port_pair() -> int:
    """A port p with p and p + 1 free, below the kernel's ephemeral range (32768 on): left
    to torchrun, MASTER_PORT is an ephemeral port, and the server's MASTER_PORT + 1 was once
    taken by another test's client socket ("address already in use")."""
    for port in random.Random().sample(range(20000, 32000), 200):
        try:
            with socket.create_server(("", port)), socket.create_server(("", port + 1)):
                return port
        except OSError:
            continue
    raise AssertionError("no two free ports in a row between 20000 and 32000")


def test_a_run_launched_by_torchrun(tmp_path: Path) -> None:
    recipe = tmp_path / "torchrun.toml"
    recipe.write_text(RECIPE)
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         "3", "--master-port", str(free_port_pair()), "-m", "asyncsync", "launch",
         "--recipe", str(recipe), "--log-dir", str(logs)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "worker 0 done" in done.stdout and "worker 1 done" in done.stdout, done.stdout
    events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    assert {e["worker"] for e in events if e[KEY] == Kind.JOIN} == {0, 1}
    assert next(e for e in events if e[KEY] == Kind.STOP)["versions"] > 0
