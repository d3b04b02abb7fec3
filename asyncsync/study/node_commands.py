"""One node of a run spread over machines: ``asyncsync server``, ``asyncsync worker`` and
``asyncsync launch`` (ranks and addresses from torchrun's or Slurm's variables, see
`asyncsync.study.launch`). Each node reads the recipe, picks its run, and serves or works
until the run ends or a signal (SIGTERM, SIGINT) stops it; a stopped worker leaves the run.
A node `asyncsync run` started stops as on a signal once that supervisor has ended.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from asyncsync.errors import InputError
from asyncsync.protocols.base import Refused
from asyncsync.schema import ConfigError
from asyncsync.study.launch import SUPERVISOR_ENV, TOKEN_ENV, from_environ
from asyncsync.study.netns import SHAPED_ENV, started
from asyncsync.study.recipe import Recipe, load_recipe
from asyncsync.study.specs import RunSpec
from asyncsync.transport.status import status_of


class JoinRefused(InputError):
    """The server refused this worker's join: its token, run id or rank; nothing ran."""


class RunRefused(InputError):
    """The server refused this worker mid-run (e.g. a newer worker took its rank over)."""


SUPERVISOR_POLL_S = 1.0
"""How often a node `asyncsync run` started checks that its supervisor still runs."""

HINTS = {403: ": give every node of the run the same --recipe, --run and --run-id",
         404: ": is this the URL of an asyncsync server?"}
"""What to check after a refused join, by status (401 and 409 say more, see `join_refused`)."""


def _pick_run(recipe: Recipe, name: str | None) -> RunSpec:
    if name is not None:
        return recipe.run(name)
    if len(recipe.runs) != 1:
        raise ConfigError(f"--run is needed: runs are {', '.join(r.name for r in recipe.runs)}")
    return recipe.runs[0]


def _node_spec(recipe: Recipe, args: argparse.Namespace) -> RunSpec:
    """The node's run, with the --tls-* flags over the recipe's ``tls`` keys; a
    kernel-shaped run is refused unless `asyncsync run` started this node in its
    namespaces (by hand, nothing would shape its links)."""
    spec = _pick_run(recipe, args.run)
    if spec.network.emulation == "kernel" and os.environ.get(SHAPED_ENV) != "1":
        raise ConfigError(
            f"run {spec.name}: network.emulation = \"kernel\": only `asyncsync run` shapes "
            "links with tc (it starts the nodes in network namespaces of their own); a "
            f"{args.command} started by hand would run unshaped: shape the hosts' links "
            "yourself and drop the network keys, or use emulation = \"app\"")
    flags = {key: str(value) for key in ("cert", "key", "ca")
             if (value := getattr(args, f"tls_{key}", None)) is not None}
    try:
        return dataclasses.replace(spec, tls=dataclasses.replace(spec.tls, **flags))
    except ValueError as exc:
        raise ConfigError(f"--tls-cert/--tls-key: {exc}") from exc


def run_record(args: argparse.Namespace) -> Path | None:
    """Where the server writes the run's recipe.json and, once it ended, its summary.json
    (what `asyncsync report` tables): its --log-dir; None without one, or when --recipe is
    that folder's recipe.json (`asyncsync run` prepared it, and writes summary.json)."""
    if args.log_dir is None:
        return None
    prepared = args.log_dir / "recipe.json"
    if prepared.exists() and args.recipe.exists() and prepared.samefile(args.recipe):
        return None
    return Path(args.log_dir)


def _write_port(path: Path, port: int) -> None:
    """Write the bound port to `path` at once (to a file beside it, then renamed)."""
    partial = path.with_suffix(".tmp")
    try:
        partial.write_text(str(port))
        partial.replace(path)
    except OSError as exc:
        raise ConfigError(f"--port-file {path}: cannot write it: {exc.strerror or exc}"
                          ) from None


async def _serve(args: argparse.Namespace, host: str, port: int) -> None:
    from asyncsync.results.report import summarize_run
    from asyncsync.study.assembly import build_server, checkpoint_file
    from asyncsync.study.executors import write_summary

    recipe = load_recipe(args.recipe)
    spec = _node_spec(recipe, args)
    events = None if args.log_dir is None else args.log_dir / "events.jsonl"
    if events is not None and not args.resume and events.exists() and events.stat().st_size:
        raise ConfigError(f"--log-dir {args.log_dir} holds a run's logs already "
                          f"({events.name}): give --resume to continue that run from its "
                          "checkpoint, or another folder (a new run would mix its logs, "
                          "summary and table with the old one's)")
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    record = run_record(args)
    if record is not None:  # as `asyncsync run` writes it (run_one.prepare_folder)
        (record / "recipe.json").write_text(json.dumps(
            {"name": recipe.name, "baseline": spec.base_name, "repeat": 0,
             "runs": [spec.as_table()]}, indent=2))
    server = build_server(spec, args.run_id or f"{recipe.name}/{spec.name}", args.log_dir,
                          host, port)
    if args.resume:
        if args.log_dir is None:
            raise ConfigError("--resume needs --log-dir (where the checkpoint is)")
        server.core.resume(checkpoint_file(args.log_dir))
    try:
        url = await server.start()
    except OSError as exc:
        await server.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stopping: list[asyncio.Task[None]] = []
    try:
        if args.port_file:
            _write_port(args.port_file, server.port)
        print(f"asyncsync server for {recipe.name}/{spec.name} ({spec.protocol.name}) at "
              f"{url}", flush=True)
        watch = _on_signals(lambda: stopping.append(asyncio.ensure_future(server.stop())))
        try:
            await server.wait_finished()
        finally:
            watch.cancel()
    finally:
        await server.close()
    if record is not None:
        write_summary(record, {**summarize_run(record), **spec.population().facts()})


def _on_signals(handler: Callable[[], None]) -> asyncio.Task[None]:
    """Call `handler` on SIGTERM (what Slurm and Kubernetes send) and SIGINT, and once the
    `asyncsync run` that started this node has ended; returns the task that watches for
    that (cancel it when the node is done)."""
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, handler)
    return asyncio.ensure_future(_supervisor_ended(handler))


async def _supervisor_ended(handler: Callable[[], None]) -> None:
    """Call `handler` once the `asyncsync run` that started this node has ended (its pid
    and start time in `SUPERVISOR_ENV`, as `netns.owner` gives them; a pid alone could
    be another process's by then); nothing for a node started otherwise, or where
    ``/proc`` cannot tell (not Linux)."""
    pid, _, start = os.environ.get(SUPERVISOR_ENV, "").partition("-")
    if not (pid.isdigit() and start.isdigit()):
        return
    while started(int(pid)) == int(start):
        await asyncio.sleep(SUPERVISOR_POLL_S)
    print(f"the asyncsync run that started this node (pid {pid}) has ended; stopping",
          flush=True)
    handler()


def _check_server(url: str) -> None:
    """Refuse a --server URL no worker can dial, before the worker is built."""
    parts = urlsplit(url)
    try:
        port_problem = "" if parts.port != 0 else "port 0 is no server's port"
    except ValueError as exc:  # a port out of range, or not a number
        port_problem = str(exc)
    if "://" not in url:
        problem = "it lacks http:// or https://"
    elif parts.scheme not in ("http", "https"):
        problem = f"scheme {parts.scheme}: is not http or https"
    elif not parts.hostname:
        problem = "it names no host"
    elif port_problem:
        problem = port_problem
    else:
        return
    raise ConfigError(f"--server {url}: {problem}; give the server's URL, e.g. "
                      "http://HOST:PORT (https://HOST:PORT when it serves TLS)")


def join_refused(refusal: Refused, url: str, rank: int) -> JoinRefused:
    """The error line of a join the server at `url` refused, with what to check."""
    from asyncsync.study.assembly import WORKER_TOKEN_ENV

    status = status_of(refusal)
    detail = " ".join(str(refusal).split())  # one line, whatever page another server sent
    detail = detail if len(detail) <= 300 else f"{detail[:300]}..."
    if not detail.startswith(f"{status}: "):
        detail = f"{status}: {detail}"
    if status == 401:
        return JoinRefused(
            f"the server at {url} refused this worker's token ({detail}): a worker sends "
            f"{WORKER_TOKEN_ENV} if set, else the worker token of {TOKEN_ENV} (or of the "
            f"recipe's token); give it the server's {TOKEN_ENV}, or as {WORKER_TOKEN_ENV} "
            f"what `asyncsync worker-token` prints for it")
    taken = status == 403 and "taken over" in detail  # (a newer join of this rank)
    hint = f": is another worker running with rank {rank}?" if status == 409 or taken else \
        HINTS.get(404 if status >= 500 else status, "")  # (asyncsync answers no 5xx)
    return JoinRefused(f"the server at {url} refused worker {rank}'s join ({detail}){hint}")


async def _work(args: argparse.Namespace, url: str, rank: int, named: str) -> None:
    """Run worker `rank` (`named`: where the rank came from, for errors) until the run
    ends; a refused first join is a `JoinRefused`, a refusal after it a `RunRefused`."""
    from asyncsync.study.assembly import build_worker

    recipe = load_recipe(args.recipe)
    spec = _node_spec(recipe, args)
    if not 0 <= rank < spec.workers:
        launched = "" if named.startswith("--") else \
            f" (ranks 1..{spec.workers}; rank 0 serves)"
        raise ConfigError(f"{named}: the run has workers 0..{spec.workers - 1}{launched}")
    if getattr(args, "server", None) is not None:
        _check_server(url)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    if getattr(args, "server", None) is None and (spec.tls.cert or spec.tls.ca):
        url = "https://" + url.removeprefix("http://")  # built from launcher variables
    worker = build_worker(spec, rank, url, args.run_id or f"{recipe.name}/{spec.name}",
                          args.log_dir, local_addr=args.bind)
    run = asyncio.ensure_future(worker.run())

    def cancel() -> None:  # the worker leaves the run on its way out
        run.cancel()

    watch = _on_signals(cancel)
    try:
        final = await run
    except asyncio.CancelledError:
        print(f"worker {rank} stopped by a signal; it left the run", flush=True)
        return
    except Refused as refusal:
        if worker.ctx.joined:
            raise RunRefused(f"the server at {url} refused worker {rank} mid-run "
                             f"({status_of(refusal)}: {refusal.reason})") from None
        raise join_refused(refusal, url, rank) from None
    finally:
        watch.cancel()
    print(f"worker {rank} done: {final['steps']} steps, {final['samples']} samples",
          flush=True)


def node_command(args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    """The coroutine of a server, worker or launch command, with launcher defaults."""
    try:
        env = from_environ(os.environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.command == "server":
        port = args.port if args.port is not None else env.server_port
        return _serve(args, args.host, port)
    if args.command == "worker":
        url, rank = args.server or env.server_url, args.rank
        rank = env.worker_rank if rank is None else rank
        if url is None or rank is None:
            raise ConfigError("worker needs --server and --rank (or MASTER_ADDR and RANK)")
        named = f"--rank {rank}" if args.rank is not None else f"{env.rank_name}={env.rank}"
        return _work(args, url, rank, named)
    if env.rank is None or env.master_addr is None:
        raise ConfigError("launch needs RANK (or SLURM_PROCID) and MASTER_ADDR")
    spec = _pick_run(load_recipe(args.recipe), args.run)
    if env.world_size is not None and env.world_size != spec.workers + 1:
        raise ConfigError(f"WORLD_SIZE={env.world_size}, but run {spec.name!r} needs "
                          f"{spec.workers} workers + 1 server = {spec.workers + 1} tasks")
    if env.rank == 0:
        return _serve(args, env.master_addr, env.server_port)
    assert env.server_url is not None and env.worker_rank is not None
    return _work(args, env.server_url, env.worker_rank, f"{env.rank_name}={env.rank}")
