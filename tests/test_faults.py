"""Crashes over real processes started through the CLI: a worker killed and restarted
(bsp, wbsp), and the server killed and resumed from its checkpoint.

Runs have a long budget and are stopped by a `stop` request once what a test waits for
has happened, so a slow or busy machine only makes them take longer, never fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncsync.runlog.schema import KEY, Kind
from asyncsync.wire.frames import CONTENT_TYPE, encode_header

RECIPE = """
[defaults]
workers = 3
[defaults.stop]
time_s = {time_s}
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 0.5
[defaults.fault]
worker_timeout_s = {worker_timeout_s}
heartbeat_s = 0.3
checkpoint_s = {checkpoint_s}
[[runs]]
name = "faulty"
protocol = "{protocol}"
"""


WORKER_TIMEOUT_S = 4.0
"""Over 13 heartbeats: a busy host does not get a live worker dropped."""


class Cluster:
    """A server and workers of one run, each a separate `asyncsync` process."""

    def __init__(self, tmp: Path, protocol: str, time_s: float, checkpoint_s: float = 0):
        self.recipe = tmp / "faulty.toml"
        self.recipe.write_text(RECIPE.format(protocol=protocol, time_s=time_s,
                                             checkpoint_s=checkpoint_s,
                                             worker_timeout_s=WORKER_TIMEOUT_S))
        self.logs = tmp
        self.port = 0  # the first server picks a free port; a restarted one takes it again
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, name: str, *args: str) -> None:
        out = (self.logs / f"{name}.out").open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "asyncsync", *args, "--recipe", str(self.recipe),
             "--log-dir", str(self.logs)], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def server(self, *extra: str) -> None:
        """Start the server and wait until it listens (on the port it picked, the first
        time: no other process can take it between a probe and the bind)."""
        port_file = self.logs / "port"
        port_file.unlink(missing_ok=True)
        self.start("server", "server", "--port", str(self.port), "--port-file",
                   str(port_file), *extra)
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert self.procs["server"].poll() is None, (self.logs / "server.out").read_text()
            assert time.monotonic() < deadline, "the server did not start listening"
            time.sleep(0.1)
        self.port = int(port_file.read_text())

    def worker(self, rank: int) -> None:
        self.start(f"worker-{rank}", "worker", "--server", self.url, "--rank", str(rank))

    def stop(self) -> None:
        """Ask the server to end the run (the CLI's run id is recipe/run)."""
        request = urllib.request.Request(
            f"{self.url}/v1/stop", data=encode_header({"run_id": "faulty/faulty"}, None),
            headers={"Content-Type": CONTENT_TYPE}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def events(self) -> list[dict[str, Any]]:
        path = self.logs / "events.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def wait_for(self, predicate: Any, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            time.sleep(0.1)
        raise AssertionError(f"no such event; log: {self.events()[-5:]}")

    def finish(self, timeout_s: float = 120.0) -> None:
        for name, proc in self.procs.items():
            if proc.returncode is None:
                assert proc.wait(timeout=timeout_s) == 0, (self.logs / f"{name}.out").read_text()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("protocol", ["bsp", "wbsp"])
def test_killed_worker_is_dropped_and_rejoins(tmp_path: Path, protocol: str) -> None:
    cluster = Cluster(tmp_path, protocol, time_s=600)
    try:
        cluster.server()
        for rank in range(3):
            cluster.worker(rank)
        at_kill = cluster.wait_for(lambda e: e[KEY] == Kind.EVAL and e["t"] >= 3)
        cluster.kill("worker-1")
        lost = cluster.wait_for(lambda e: e[KEY] == Kind.WORKER_LOST, timeout_s=20)
        assert lost["worker"] == 1
        # the others go on without it
        cluster.wait_for(lambda e: e[KEY] == Kind.EVAL and e["t"] > lost["t"] + 1
                         and e["version"] > at_kill["version"] + 5)
        cluster.worker(1)
        back = cluster.wait_for(lambda e: e[KEY] == Kind.REJOIN, timeout_s=60)
        assert back["worker"] == 1
        cluster.wait_for(lambda e: e[KEY] == Kind.EVAL and e["t"] > back["t"] + 1
                         and e["version"] > back["version"] + 5)
        cluster.stop()
        cluster.finish()
    finally:
        cluster.close()
    events = cluster.events()
    stop = next(e for e in events if e[KEY] == Kind.STOP)
    evals = [e for e in events if e[KEY] == Kind.EVAL]
    after = [e for e in evals if e["t"] > back["t"]]
    assert after and after[-1]["version"] > back["version"]
    assert max(e["accuracy"] for e in after) > at_kill["accuracy"]
    assert stop["versions"] > back["version"]


def test_killed_server_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "bsp", time_s=600, checkpoint_s=0.5)
    try:
        cluster.server()
        for rank in range(3):
            cluster.worker(rank)
        cluster.wait_for(lambda e: e[KEY] == Kind.CHECKPOINT and e["t"] >= 3)
        cluster.kill("server")
        with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as checkpoint:
            saved, saved_t = int(checkpoint["version"]), float(checkpoint["elapsed"])
        cluster.server("--resume")
        resumed = cluster.wait_for(lambda e: e[KEY] == Kind.RESUME)
        assert resumed["version"] == saved  # no checkpointed version is lost
        cluster.wait_for(lambda e: e[KEY] == Kind.REJOIN, timeout_s=60)
        cluster.wait_for(lambda e: e[KEY] == Kind.EVAL and e["version"] > saved + 5)
        cluster.stop()
        cluster.finish()
    finally:
        cluster.close()
    events = cluster.events()
    stop = next(e for e in events if e[KEY] == Kind.STOP)
    assert stop["versions"] > saved + 5
    # the clock continued from the checkpoint's time (taken when its model was, so it can
    # be earlier than the t of the checkpoint record written after the file)
    assert saved_t > 0 and resumed["t"] >= round(saved_t, 3)
    later = [e for e in events if e[KEY] == Kind.EVAL and e["version"] > saved]
    assert later and min(e["t"] for e in later) >= resumed["t"]
    assert (tmp_path / "checkpoint.npz").exists()
    assert not (tmp_path / "checkpoint.npz.tmp").exists()


def test_sigterm_stops_a_worker_and_the_server_cleanly(tmp_path: Path) -> None:
    """What Slurm and Kubernetes send: a worker leaves the run (it is not lost), and the
    server writes its final checkpoint and stop event, then exits 0."""
    cluster = Cluster(tmp_path, "asp", time_s=600, checkpoint_s=60)
    try:
        cluster.server()
        for rank in range(3):
            cluster.worker(rank)
        cluster.wait_for(lambda e: e[KEY] == Kind.EVAL and e["version"] > 20)
        cluster.procs["worker-0"].send_signal(signal.SIGTERM)
        assert cluster.procs["worker-0"].wait(timeout=60) == 0
        out = (tmp_path / "worker-0.out").read_text()
        assert "stopped by a signal" in out
        time.sleep(WORKER_TIMEOUT_S + 1)  # past the worker timeout: a lost one would show
        cluster.procs["server"].send_signal(signal.SIGTERM)
        cluster.finish(timeout_s=60)
    finally:
        cluster.close()
    events = cluster.events()
    names = [e[KEY] for e in events]
    assert Kind.WORKER_LOST not in names
    assert names[-1] == Kind.STOP and Kind.CHECKPOINT in names
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as saved:
        assert int(saved["version"]) == events[-1]["versions"]
