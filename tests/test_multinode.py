"""Nodes started only through the CLI, as separate processes on distinct loopback
addresses, by explicit flags and by launcher variables (torchrun, Slurm)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.launch import from_environ

RECIPE = """
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
protocol = "bsp"
"""


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "asyncsync", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        outputs.append(out)
    return outputs


def versions(log_dir: Path) -> int:
    events = [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
    joined = {e["worker"] for e in events if e[KEY] == Kind.JOIN}
    assert joined == {0, 1}
    return int(next(e for e in events if e[KEY] == Kind.STOP)["versions"])


def test_server_and_workers_on_distinct_loopback_addresses(tmp_path: Path) -> None:
    recipe = tmp_path / "net.toml"
    recipe.write_text(RECIPE)
    port = free_port("127.0.0.2")
    common = ["--recipe", str(recipe), "--log-dir", str(tmp_path)]
    server = start(["server", *common, "--host", "127.0.0.2", "--port", str(port)])
    workers = [start(["worker", *common, "--server", f"http://127.0.0.2:{port}",
                      "--rank", str(rank), "--bind", f"127.0.0.{3 + rank}"])
               for rank in range(2)]
    outputs = finish([server, *workers])
    assert f"at http://127.0.0.2:{port}" in outputs[0]
    assert "worker 1 done" in outputs[2]
    assert versions(tmp_path) > 5


def test_launch_from_torchrun_variables(tmp_path: Path) -> None:
    recipe = tmp_path / "net.toml"
    recipe.write_text(RECIPE)
    port = free_port("127.0.0.2")
    procs = [start(["launch", "--recipe", str(recipe), "--log-dir", str(tmp_path)],
                   {"RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.2",
                    "MASTER_PORT": str(port)})
             for rank in range(3)]
    outputs = finish(procs)
    assert "asyncsync server" in outputs[0] and "worker 0 done" in outputs[1]
    assert versions(tmp_path) > 5


def test_launch_rejects_a_world_size_that_does_not_fit(tmp_path: Path) -> None:
    recipe = tmp_path / "net.toml"
    recipe.write_text(RECIPE)
    proc = start(["launch", "--recipe", str(recipe)],
                 {"RANK": "0", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "WORLD_SIZE=5" in out and "3 tasks" in out


@pytest.mark.parametrize(
    ("environ", "rank", "world", "url", "worker"),
    [
        ({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
         2, 4, "http://10.0.0.1:29500", 1),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "5", "MASTER_ADDR": "node7"},
         0, 5, "http://node7:8470", None),
        ({}, None, None, None, None),
    ],
)
def test_launcher_variables(environ: dict[str, str], rank: int | None, world: int | None,
                            url: str | None, worker: int | None) -> None:
    env = from_environ(environ)
    assert (env.rank, env.world_size, env.server_url, env.worker_rank) == (rank, world, url,
                                                                           worker)
    with pytest.raises(ValueError, match="RANK"):
        from_environ({"RANK": "one"})
