"""A real-clock run on this machine: a server process and N worker processes.

Each node is started through the public CLI (``asyncsync server`` / ``asyncsync worker``)
with one torch thread, so the runner exercises exactly what a multi-machine launch does.
The run token (ASYNCSYNC_TOKEN or the recipe's, else a random one per run) goes to the
server only; the supervisor keeps it to watch the run, and the workers get the worker
token derived from it (ASYNCSYNC_WORKER_TOKEN), which cannot stop the run. Tokens travel
through the environment, never on a command line or in the logs. With the recipe's
``tls.cert`` the server serves https on loopback (the certificate must name 127.0.0.1).
The nodes write their logs and console output (``*.log``) into the run's folder, and stop
when the supervisor has ended (`SUPERVISOR_ENV`: killed outright, it cannot stop them). With
``network.emulation = "kernel"`` the nodes run in network namespaces shaped by tc
(`asyncsync.study.netns`) and the server listens on its namespace's address only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import ssl
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from asyncsync.clock import now
from asyncsync.protocols.base import Refused
from asyncsync.study.assembly import WORKER_TOKEN_ENV, run_client_tls
from asyncsync.study.children import ending
from asyncsync.study.launch import SUPERVISOR_ENV, TOKEN_ENV
from asyncsync.study.netns import SHAPED_ENV, RunNetwork, call_in, owner
from asyncsync.study.specs import RunSpec
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


def node_env(run_token: str, server: bool, shaped: bool = False) -> dict[str, str]:
    """A node's environment: the server gets the run token, a worker the worker token;
    `shaped`: the node runs in a kernel-shaped run's namespace (`SHAPED_ENV`); every node
    gets this process's pid and start time (`SUPERVISOR_ENV`: it stops once this process
    has ended)."""
    env = {key: value for key, value in os.environ.items()
           if key not in (TOKEN_ENV, WORKER_TOKEN_ENV, SHAPED_ENV)}
    if shaped:
        env[SHAPED_ENV] = "1"
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                SUPERVISOR_ENV: owner()})
    if server:
        env[TOKEN_ENV] = run_token
    else:
        env[WORKER_TOKEN_ENV] = worker_token(run_token)
    return env


def _spawn(name: str, args: list[str], run_dir: Path, env: dict[str, str],
           prefix: Sequence[str] = ()) -> _Node:
    output = (run_dir / f"{name}.log").open("wb")
    process = subprocess.Popen([*prefix, sys.executable, "-m", "asyncsync", *args],
                               stdout=output, stderr=subprocess.STDOUT, env=env)
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
    exits; `on_status` gets the server's status about twice a second. With
    ``network.emulation = "kernel"`` each node runs in a network namespace of its own
    (`asyncsync.study.netns`), removed when the run ends however it ends."""
    if spec.network.emulation != "kernel":
        await _run_nodes(spec, recipe_name, run_dir, on_status, None)
        return
    network = RunNetwork.of(spec)
    network.create()  # (these two block the loop briefly: nothing may interrupt them)
    try:
        await _run_nodes(spec, recipe_name, run_dir, on_status, network)
    finally:
        network.remove()


async def _run_nodes(spec: RunSpec, recipe_name: str, run_dir: Path, on_status: StatusSink,
                     network: RunNetwork | None) -> None:
    recipe_file = run_dir / "recipe.json"
    run_id = f"{recipe_name}/{spec.name}/{secrets.token_hex(4)}"
    common = ["--recipe", str(recipe_file), "--run", spec.name, "--run-id", run_id,
              "--log-dir", str(run_dir)]
    port_file = run_dir / "server.port"
    token = spec.resolved_token() or secrets.token_urlsafe(16)  # never written to logs
    tls = run_client_tls(spec)  # (a bad tls.ca fails here, before any node starts)
    host = network.address("server") if network else "127.0.0.1"
    server = _spawn("server", ["server", *common, "--host", host, "--port", "0",
                               "--port-file", str(port_file)], run_dir,
                    node_env(token, server=True, shaped=network is not None),
                    network.command("server") if network else ())
    nodes = [server]
    try:
        port = await _wait_for_port(port_file, server, STARTUP_S)
        url = f"{'https' if spec.tls.cert else 'http'}://{host}:{port}"
        nodes += [_spawn(f"worker-{rank}", ["worker", *common, "--server", url,
                                            "--rank", str(rank)], run_dir,
                         node_env(token, server=False, shaped=network is not None),
                         network.command(f"w{rank}") if network else ())
                  for rank in range(spec.workers)]
        status = StatusPoll(url, run_id, token, tls,
                            network.namespace("server") if network else None)
        await _watch(spec, status, nodes, on_status)
    except BaseException:
        for node in nodes:  # a failed or interrupted run: its nodes stop now
            if node.process.poll() is None:
                node.process.terminate()
        raise
    finally:
        await _reap(nodes)


class StatusPoll:
    """Asks the server for its status; from inside the server's namespace when it has one
    (a thread of its own there, per request: the supervisor stays in the host's)."""

    def __init__(self, url: str, run_id: str, token: str, tls: ssl.SSLContext | None,
                 namespace: str | None) -> None:
        self.run_id = run_id
        self.namespace = namespace
        self._dial = (url, token, tls)
        self._kept = None if namespace else self._client()

    def _client(self) -> HttpTransport:
        url, token, tls = self._dial
        return HttpTransport(url, numel=0, timeout_s=5.0, connect_timeout_s=0.0, token=token,
                             tls=tls)

    async def __call__(self) -> dict[str, Any]:
        if self.namespace is None:
            assert self._kept is not None
            status, _ = await self._kept.request("status", {"run_id": self.run_id})
            return status
        namespace = self.namespace
        return await asyncio.to_thread(call_in, namespace, lambda: asyncio.run(self._once()))

    async def _once(self) -> dict[str, Any]:
        client = self._client()
        try:
            status, _ = await client.request("status", {"run_id": self.run_id})
            return status
        finally:
            await client.close()

    async def close(self) -> None:
        if self._kept is not None:
            await self._kept.close()


async def _watch(spec: RunSpec, status: StatusPoll, nodes: list[_Node],
                 on_status: StatusSink) -> None:
    """Poll the server's status for the dashboard until the server process exits."""
    server = nodes[0]
    deadline = now() + STARTUP_S + spec.stop.time_s + 60.0
    try:
        while server.process.poll() is None:
            if now() > deadline:
                raise RuntimeError(f"run {spec.name} did not finish in time; "
                                   f"see {server.output.name}")
            with contextlib.suppress(OSError, asyncio.TimeoutError, Refused):
                on_status(await status())
            dead = [n for n in nodes[1:] if n.process.poll() not in (None, 0)]
            if dead:  # how: a crash, or killed (SIGKILL: out of memory) with no word in its log
                raise RuntimeError("; ".join(f"{n.name} {ending(n.process.returncode)}"
                                             for n in dead) + "; see its .log in the run "
                                   "directory")
            await asyncio.sleep(0.5)
    finally:
        await status.close()
    if server.process.returncode != 0:
        raise RuntimeError(f"the server {ending(server.process.returncode)}; see "
                           f"{server.output.name}")


async def _reap(nodes: list[_Node], grace_s: float = 20.0) -> None:
    deadline = now() + grace_s
    for node in nodes:
        while node.process.poll() is None and now() < deadline:
            await asyncio.sleep(0.1)
        if node.process.poll() is None:
            node.process.kill()
            node.process.wait()
        node.output.close()
