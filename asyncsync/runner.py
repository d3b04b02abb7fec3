"""Runs a recipe: for each run, a server process and N worker processes on this machine.

Each node is started through the public CLI (``asyncsync server`` / ``asyncsync worker``)
with one torch thread, so the runner exercises exactly what a multi-machine launch does.
The run token (ASYNCSYNC_TOKEN or the recipe's, else a random one per run) goes to the
server only; the runner keeps it to watch the run, and the workers get the worker token
derived from it (ASYNCSYNC_WORKER_TOKEN), which cannot stop the run. Tokens travel through
the environment, never on a command line or in the logs. With the recipe's ``tls.cert``
the server serves https on loopback (the certificate must name 127.0.0.1). Every
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
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from asyncsync.assembly import WORKER_TOKEN_ENV, run_client_tls, run_data
from asyncsync.dashboard import Dashboard
from asyncsync.protocols.base import Refused
from asyncsync.recipe import TOKEN_ENV, Recipe, RunSpec, load_recipe
from asyncsync.report import publish, summarize_run
from asyncsync.simulation import calibrate_step_s, simulate, write_summary
from asyncsync.tracking import Tracker, follow
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.tokens import worker_token

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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited early; see {server.output.name}")
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not start in time")


async def _run_one(spec: RunSpec, recipe: Recipe, run_dir: Path, dashboard: Dashboard,
                   index: int, repeat: int = 0) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    recipe_file = run_dir / "recipe.json"
    recipe_file.write_text(json.dumps(
        {"name": recipe.name, "baseline": spec.name, "repeat": repeat,
         "runs": [spec.as_table()]},
        indent=2))
    if spec.clock == "virtual":
        return await _run_virtual(spec, run_dir, f"{recipe.name}/{spec.name}", dashboard, index)
    run_id = f"{recipe.name}/{spec.name}/{secrets.token_hex(4)}"
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
        await _watch(spec, url, run_id, token, tls, nodes, dashboard, index)
    finally:
        await _reap(nodes)
    return summarize_run(run_dir)


_CALIBRATED: dict[str, float] = {}


def calibrated_step_s(spec: RunSpec) -> float:
    """The base step time of a virtual run, measured once per model, data and batch size in
    this process (so the runs of a recipe are charged alike)."""
    key = json.dumps([spec.model.name, spec.model.options, spec.data.name,
                      spec.data.batch_size], sort_keys=True)
    if key not in _CALIBRATED:
        _CALIBRATED[key] = calibrate_step_s(spec)
    return _CALIBRATED[key]


async def _run_virtual(spec: RunSpec, run_dir: Path, run_id: str, dashboard: Dashboard,
                       index: int) -> dict[str, Any]:
    """Simulate the run in a thread of its own (its loop is virtual); show its progress."""
    calibrated = None
    if spec.compute.calibrate:
        calibrated = await asyncio.to_thread(calibrated_step_s, spec)
        dashboard.console.print(
            f"{spec.name}: calibrated base_step_s = {calibrated:.4g} s on this host "
            f"(host-dependent); pin it with --set compute.base_step_s={calibrated:.4g}")
    latest: list[dict[str, Any]] = []

    def sink(status: dict[str, Any]) -> None:  # called from the simulation's thread
        latest[:] = [status]

    job = asyncio.ensure_future(asyncio.to_thread(simulate, spec, run_dir, run_id, sink,
                                                  calibrated))
    while not job.done():
        if latest:
            dashboard.update(spec, index, latest[0])
        await asyncio.wait({job}, timeout=0.5)
    return {**summarize_run(run_dir), **job.result()}


async def _watch(spec: RunSpec, url: str, run_id: str, token: str,
                 tls: ssl.SSLContext | None, nodes: list[_Node], dashboard: Dashboard,
                 index: int) -> None:
    """Poll the server's status for the dashboard until the server process exits."""
    status_client = HttpTransport(url, numel=0, timeout_s=5.0, connect_timeout_s=0.0,
                                  token=token, tls=tls)
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


def check_data(recipe: Recipe) -> None:
    """Load every dataset the recipe's runs read from disk, once each.

    Raises:
        DatasetMissing: one is absent (the error names the expected path).
    """
    seen = set()
    for spec in recipe.runs:
        key = (spec.data.name, spec.data.root, spec.data.download)
        if spec.data.name != "synthetic" and key not in seen:
            seen.add(key)
            run_data(spec)


async def run_and_record(spec: RunSpec, recipe: Recipe, run_dir: Path, dashboard: Dashboard,
                         index: int, repeat: int) -> dict[str, Any]:
    """Run one run and write its folder; returns its summary.

    A run that fails gets a summary.json with its ``error`` (a run that failed before it
    started leaves no folder); one cut short by Ctrl-C gets one with ``interrupted: true``,
    and the cancellation goes on.
    """
    failed = {"run": spec.name, "protocol": spec.protocol.name, "repeat": repeat,
              "seed": spec.seed}
    try:
        summary = await _run_one(spec, recipe, run_dir, dashboard, index, repeat)
    except RuntimeError as exc:
        summary = {**failed, "error": str(exc)}
    except asyncio.CancelledError:
        if run_dir.is_dir():
            write_summary(run_dir, {**failed, "error": "interrupted", "interrupted": True})
        raise
    if run_dir.is_dir():
        write_summary(run_dir, summary)
    return summary


async def run_recipe(recipe: Recipe, logs: Path = Path("logs"), live: bool | None = None,
                     trackers: Sequence[Tracker] = ()) -> list[dict[str, Any]]:
    """Run every run of `recipe` in turn; returns their summaries and prints the table.

    Each run's logs stream to the `trackers` while it runs (read here, in the supervisor).

    On Ctrl-C (the task is cancelled) it prints "interrupted", the table of the runs that
    finished and the log path, then lets the cancellation go on.
    """
    await asyncio.to_thread(check_data, recipe)  # before any folder, not in N processes
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = logs / recipe.name / stamp
    root.mkdir(parents=True)
    (root / "recipe.json").write_text(json.dumps(recipe.as_table(), indent=2))
    dashboard = Dashboard(recipe, live)
    summaries: list[dict[str, Any]] = []
    run_dirs: list[Path] = []
    try:
        with dashboard:
            for index, spec in enumerate(recipe.runs):
                for repeat, run in enumerate(recipe.repeated(spec)):
                    name = spec.name if recipe.repeats == 1 else f"{spec.name}-r{repeat}"
                    job = run_and_record(run, recipe, root / name, dashboard, index, repeat)
                    summary = await (follow(root / name, job, trackers) if trackers else job)
                    summaries.append(summary)
                    run_dirs.append(root / name)
                    dashboard.finished(spec, index, summary)
    except asyncio.CancelledError:
        dashboard.console.print("[yellow]interrupted[/yellow]: the run in progress is marked "
                                "interrupted in its summary.json")
        _publish(run_dirs, summaries, recipe, root, dashboard)
        raise
    finally:
        for tracker in trackers:
            tracker.close()
    _publish(run_dirs, summaries, recipe, root, dashboard)
    return summaries


def _publish(run_dirs: list[Path], summaries: list[dict[str, Any]], recipe: Recipe, root: Path,
             dashboard: Dashboard) -> None:
    """The table, CSV and plots of the finished runs, then where the logs are."""
    if summaries:
        publish(run_dirs, summaries, recipe.baseline, root, dashboard.console,
                title=recipe.name)
    dashboard.console.print(f"logs: {root}", highlight=False)


def run_recipe_file(path: str | Path, overrides: list[str], only: list[str],
                    logs: Path = Path("logs"), live: bool | None = None,
                    repeats: int | None = None, trackers: Sequence[Tracker] = (),
                    ) -> list[dict[str, Any]]:
    """Load and run a recipe file (the CLI's ``run``)."""
    return asyncio.run(run_recipe(load_recipe(path, overrides, only, repeats), logs, live,
                                  trackers))
