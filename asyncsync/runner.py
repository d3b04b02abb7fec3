"""Runs a recipe: for each run, a server process and N worker processes on this machine.

Each node is started through the public CLI (``asyncsync server`` / ``asyncsync worker``)
with one torch thread, so the runner exercises exactly what a multi-machine launch does.
The nodes of a run share a bearer token (the recipe's or ASYNCSYNC_TOKEN, else a random
one per run) passed through the environment, never on a command line or in the logs. Every
run writes ``logs/<recipe>/<timestamp>/<run>/``: ``recipe.json`` (the resolved run),
``events.jsonl`` (server: start, evaluations, stop), ``worker-<rank>.jsonl`` (spans and
totals), the nodes' console output (``*.log``) and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from asyncsync.dashboard import Dashboard
from asyncsync.data import BatchSampler, Dataset, load_dataset
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.partition import partition
from asyncsync.metrics import JsonlLog
from asyncsync.models import build_model
from asyncsync.protocols.base import Refused, get_protocol
from asyncsync.recipe import TOKEN_ENV, Recipe, RunSpec, load_recipe
from asyncsync.report import publish, summarize_run
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer

STARTUP_S = 120.0
"""How long processes may take to start and join before a run is abandoned."""


def _run_data(spec: RunSpec) -> Dataset:
    return load_dataset(spec.data.name, spec.seed, spec.data.root, spec.data.download)


def _model(spec: RunSpec, data: Dataset) -> torch.nn.Module:
    torch.manual_seed(spec.seed)
    return build_model(spec.model.name, data.input_shape, data.num_classes, spec.model.options)


def build_server(spec: RunSpec, run_id: str, log_dir: Path | None, host: str = "127.0.0.1",
                 port: int = 0) -> ParameterServer:
    """The parameter server of one run, as the CLI's ``server`` command starts it."""
    data = _run_data(spec)
    events = JsonlLog(log_dir / "events.jsonl" if log_dir else None)
    settings = ServerSettings(
        run_id=run_id, lr=spec.optim.lr, momentum=spec.optim.momentum,
        weight_decay=spec.optim.weight_decay, eval_interval_s=spec.eval.interval_s,
        time_s=spec.stop.time_s, target_accuracy=spec.stop.target_accuracy,
        stop_at_target=spec.stop.stop_at_target, worker_timeout_s=spec.fault.worker_timeout_s,
        checkpoint_path=checkpoint_file(log_dir) if spec.fault.checkpoint_s and log_dir
        else None, checkpoint_s=spec.fault.checkpoint_s or 10.0)
    return ParameterServer(
        _model(spec, data), get_protocol(spec.protocol.name), spec.workers, settings,
        host=host, port=port, token=spec.resolved_token(),
        protocol_params=spec.protocol.params, test_data=(data.test_x, data.test_y),
        events=events)


def checkpoint_file(log_dir: Path) -> Path:
    """Where a run's server keeps its checkpoint."""
    return log_dir / "checkpoint.npz"


def build_worker(spec: RunSpec, rank: int, url: str, run_id: str,
                 log_dir: Path | None, local_addr: str | None = None) -> Worker:
    """Worker `rank` of one run, as the CLI's ``worker`` command starts it."""
    if not 0 <= rank < spec.workers:
        raise ValueError(f"rank {rank} is outside 0..{spec.workers - 1}")
    data = _run_data(spec)
    shards = partition(data.train_y, spec.workers, spec.data.partition, spec.seed,
                       spec.data.alpha, spec.data.classes_per_worker)
    sampler = BatchSampler(data, shards[rank], seed=spec.seed * 1000 + rank)
    return Worker(
        rank, url, _model(spec, data), sampler.next, get_protocol(spec.protocol.name),
        protocol_params=spec.protocol.params, run_id=run_id, lr=spec.optim.lr,
        momentum=spec.optim.momentum, weight_decay=spec.optim.weight_decay,
        batch_size=spec.data.batch_size, slowdown=spec.compute_profile(rank), device=spec.device,
        link=spec.network.link(rank), local_addr=local_addr, token=spec.resolved_token(),
        heartbeat_s=spec.fault.heartbeat_s,
        log_path=log_dir / f"worker-{rank}.jsonl" if log_dir else None)


@dataclass
class _Node:
    name: str
    process: subprocess.Popen[bytes]
    output: IO[bytes]


def _spawn(name: str, args: list[str], run_dir: Path, token: str) -> _Node:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", TOKEN_ENV: token}
    output = (run_dir / f"{name}.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "asyncsync", *args], stdout=output,
                               stderr=subprocess.STDOUT, env=env)
    return _Node(name, process, output)


async def _wait_for_port(port_file: Path, server: _Node, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited early; see {server.output.name}")
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not start in time")


async def _run_one(spec: RunSpec, recipe: Recipe, run_dir: Path, dashboard: Dashboard,
                   index: int) -> dict[str, Any]:
    if spec.data.name != "synthetic":  # fail here, with the path, not in N processes
        await asyncio.to_thread(_run_data, spec)
    run_dir.mkdir(parents=True)
    recipe_file = run_dir / "recipe.json"
    recipe_file.write_text(json.dumps(
        {"name": recipe.name, "baseline": spec.name, "runs": [spec.as_table()]},
        indent=2))
    run_id = f"{recipe.name}/{spec.name}/{secrets.token_hex(4)}"
    common = ["--recipe", str(recipe_file), "--run", spec.name, "--run-id", run_id,
              "--log-dir", str(run_dir)]
    port_file = run_dir / "server.port"
    token = spec.resolved_token() or secrets.token_urlsafe(16)  # never written to logs
    server = _spawn("server", ["server", *common, "--port", "0", "--port-file",
                               str(port_file)], run_dir, token)
    nodes = [server]
    try:
        port = await _wait_for_port(port_file, server, STARTUP_S)
        url = f"http://127.0.0.1:{port}"
        nodes += [_spawn(f"worker-{rank}", ["worker", *common, "--server", url,
                                            "--rank", str(rank)], run_dir, token)
                  for rank in range(spec.workers)]
        await _watch(spec, url, run_id, token, nodes, dashboard, index)
    finally:
        await _reap(nodes)
    summary = summarize_run(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def _watch(spec: RunSpec, url: str, run_id: str, token: str, nodes: list[_Node],
                 dashboard: Dashboard, index: int) -> None:
    """Poll the server's status for the dashboard until the server process exits."""
    status_client = HttpTransport(url, numel=0, timeout_s=5.0, connect_timeout_s=0.0,
                                  token=token)
    server = nodes[0]
    deadline = time.monotonic() + STARTUP_S + spec.stop.time_s + 60.0
    try:
        while server.process.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {spec.name} did not finish in time; "
                                   f"see {server.output.name}")
            with contextlib.suppress(OSError, asyncio.TimeoutError, Refused):
                status, _ = await status_client.request("status", {"run_id": run_id})
                dashboard.update(spec, index, status)
            dead = [n.name for n in nodes[1:] if n.process.poll() not in (None, 0)]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} failed; see its .log in the run directory")
            await asyncio.sleep(0.5)
    finally:
        await status_client.close()
    if server.process.returncode != 0:
        raise RuntimeError(f"the server failed; see {server.output.name}")


async def _reap(nodes: list[_Node], grace_s: float = 20.0) -> None:
    deadline = time.monotonic() + grace_s
    for node in nodes:
        while node.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if node.process.poll() is None:
            node.process.kill()
            node.process.wait()
        node.output.close()


async def run_recipe(recipe: Recipe, logs: Path = Path("logs"), live: bool | None = None,
                     ) -> list[dict[str, Any]]:
    """Run every run of `recipe` in turn; returns their summaries and prints the table."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = logs / recipe.name / stamp
    root.mkdir(parents=True)
    (root / "recipe.json").write_text(json.dumps(recipe.as_table(), indent=2))
    dashboard = Dashboard(recipe, live)
    summaries = []
    with dashboard:
        for index, spec in enumerate(recipe.runs):
            try:
                summary = await _run_one(spec, recipe, root / spec.name, dashboard, index)
            except RuntimeError as exc:
                summary = {"run": spec.name, "protocol": spec.protocol.name, "error": str(exc)}
            summaries.append(summary)
            dashboard.finished(spec, index, summary)
    publish([root / spec.name for spec in recipe.runs], summaries, recipe.baseline, root,
            dashboard.console, title=recipe.name)
    dashboard.console.print(f"logs: {root}")
    return summaries


def run_recipe_file(path: str | Path, overrides: list[str], only: list[str],
                    logs: Path = Path("logs"), live: bool | None = None) -> list[dict[str, Any]]:
    """Load and run a recipe file (the CLI's ``run``)."""
    return asyncio.run(run_recipe(load_recipe(path, overrides, only), logs, live))
