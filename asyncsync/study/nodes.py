"""A real-clock run on this machine: a server process and N worker processes.

Each node is started through the public CLI (``asyncsync server`` / ``asyncsync worker``)
with one torch thread, so the runner exercises exactly what a multi-machine launch does.
The run token (ASYNCSYNC_TOKEN or the recipe's, else a random one per run) goes to the
server only; the supervisor keeps it to watch the run, and the workers get the worker
token derived from it (ASYNCSYNC_WORKER_TOKEN), which cannot stop the run. Tokens travel
through the environment, never on a command line or in the logs. With the recipe's
``tls.cert`` the server serves https on loopback (the certificate must name 127.0.0.1).
The nodes write their logs and console output (``*.log``) into the run's folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import ssl
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from asyncsync.clock import now
from asyncsync.protocols.base import Refused
from asyncsync.study.assembly import WORKER_TOKEN_ENV, run_client_tls
from asyncsync.study.specs import TOKEN_ENV, RunSpec
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.tokens import worker_token

StatusSink = Callable[[dict[str, Any]], None]

STARTUP_S = 120.0
"""How long processes may take to start and join before a run is abandoned."""


@dataclass
class _Node:
    name: str
    process: subprocess.Popen[bytes]
    output: IO[bytes]


def node_env(run_token: str, server: bool) -> dict[str, str]:
    """A node's environment: the server gets the run token, a worker the worker token."""
    env = {key: value for key, value in os.environ.items()
           if key not in (TOKEN_ENV, WORKER_TOKEN_ENV)}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if server:
        env[TOKEN_ENV] = run_token
    else:
        env[WORKER_TOKEN_ENV] = worker_token(run_token)
    return env


def _spawn(name: str, args: list[str], run_dir: Path, env: dict[str, str]) -> _Node:
    output = (run_dir / f"{name}.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "asyncsync", *args], stdout=output,
                               stderr=subprocess.STDOUT, env=env)
    return _Node(name, process, output)


async def _wait_for_port(port_file: Path, server: _Node, timeout_s: float) -> int:
    deadline = now() + timeout_s
    while now() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited early; see {server.output.name}")
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not start in time")


async def run_nodes(spec: RunSpec, recipe_name: str, run_dir: Path,
                    on_status: StatusSink) -> None:
    """Run `spec` (its recipe.json already in `run_dir`) as processes until the server
    exits; `on_status` gets the server's status about twice a second."""
    recipe_file = run_dir / "recipe.json"
    run_id = f"{recipe_name}/{spec.name}/{secrets.token_hex(4)}"
    common = ["--recipe", str(recipe_file), "--run", spec.name, "--run-id", run_id,
              "--log-dir", str(run_dir)]
    port_file = run_dir / "server.port"
    token = spec.resolved_token() or secrets.token_urlsafe(16)  # never written to logs
    tls = run_client_tls(spec)  # (a bad tls.ca fails here, before any node starts)
    server = _spawn("server", ["server", *common, "--port", "0", "--port-file",
                               str(port_file)], run_dir, node_env(token, server=True))
    nodes = [server]
    try:
        port = await _wait_for_port(port_file, server, STARTUP_S)
        url = f"{'https' if spec.tls.cert else 'http'}://127.0.0.1:{port}"
        nodes += [_spawn(f"worker-{rank}", ["worker", *common, "--server", url,
                                            "--rank", str(rank)], run_dir,
                         node_env(token, server=False))
                  for rank in range(spec.workers)]
        await _watch(spec, url, run_id, token, tls, nodes, on_status)
    finally:
        await _reap(nodes)



async def _watch(spec: RunSpec, url: str, run_id: str, token: str,
                 tls: ssl.SSLContext | None, nodes: list[_Node], on_status: StatusSink
                 ) -> None:
    """Poll the server's status for the dashboard until the server process exits."""
    status_client = HttpTransport(url, numel=0, timeout_s=5.0, connect_timeout_s=0.0,
                                  token=token, tls=tls)
    server = nodes[0]
    deadline = now() + STARTUP_S + spec.stop.time_s + 60.0
    try:
        while server.process.poll() is None:
            if now() > deadline:
                raise RuntimeError(f"run {spec.name} did not finish in time; "
                                   f"see {server.output.name}")
            with contextlib.suppress(OSError, asyncio.TimeoutError, Refused):
                status, _ = await status_client.request("status", {"run_id": run_id})
                on_status(status)
            dead = [n.name for n in nodes[1:] if n.process.poll() not in (None, 0)]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} failed; see its .log in the run directory")
            await asyncio.sleep(0.5)
    finally:
        await status_client.close()
    if server.process.returncode != 0:
        raise RuntimeError(f"the server failed; see {server.output.name}")


async def _reap(nodes: list[_Node], grace_s: float = 20.0) -> None:
    deadline = now() + grace_s
    for node in nodes:
        while node.process.poll() is None and now() < deadline:
            await asyncio.sleep(0.1)
        if node.process.poll() is None:
            node.process.kill()
            node.process.wait()
        node.output.close()
