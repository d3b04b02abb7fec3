"""One node of a run spread over machines: ``asyncsync server``, ``asyncsync worker`` and
``asyncsync launch`` (ranks and addresses from torchrun's or Slurm's variables, see
`asyncsync.study.launch`). Each node reads the recipe, picks its run, and serves or works
until the run ends or a signal (SIGTERM, SIGINT) stops it; a stopped worker leaves the run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from asyncsync.schema import ConfigError
from asyncsync.study.launch import from_environ
from asyncsync.study.recipe import Recipe, load_recipe
from asyncsync.study.specs import RunSpec


def _pick_run(recipe: Recipe, name: str | None) -> RunSpec:
    if name is not None:
        return recipe.run(name)
    if len(recipe.runs) != 1:
        raise ConfigError(f"--run is needed: runs are {', '.join(r.name for r in recipe.runs)}")
    return recipe.runs[0]


def _node_spec(recipe: Recipe, args: argparse.Namespace) -> RunSpec:
    """The node's run, with the --tls-* flags over the recipe's ``tls`` keys."""
    spec = _pick_run(recipe, args.run)
    flags = {key: str(value) for key in ("cert", "key", "ca")
             if (value := getattr(args, f"tls_{key}", None)) is not None}
    try:
        return dataclasses.replace(spec, tls=dataclasses.replace(spec.tls, **flags))
    except ValueError as exc:
        raise ConfigError(f"--tls-cert/--tls-key: {exc}") from exc


async def _serve(args: argparse.Namespace, host: str, port: int) -> None:
    from asyncsync.study.assembly import build_server, checkpoint_file

    recipe = load_recipe(args.recipe)
    spec = _node_spec(recipe, args)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
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
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(server.port))
        tmp.replace(args.port_file)
    print(f"asyncsync server for {recipe.name}/{spec.name} ({spec.protocol.name}) at {url}",
          flush=True)
    stopping: list[asyncio.Task[None]] = []
    _on_signals(lambda: stopping.append(asyncio.ensure_future(server.stop())))
    try:
        await server.wait_finished()
    finally:
        await server.close()


def _on_signals(handler: Callable[[], None]) -> None:
    """Call `handler` on SIGTERM (what Slurm and Kubernetes send) and SIGINT."""
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, handler)


async def _work(args: argparse.Namespace, url: str, rank: int) -> None:
    from asyncsync.study.assembly import build_worker

    recipe = load_recipe(args.recipe)
    spec = _node_spec(recipe, args)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    if getattr(args, "server", None) is None and (spec.tls.cert or spec.tls.ca):
        url = "https://" + url.removeprefix("http://")  # built from launcher variables
    worker = build_worker(spec, rank, url, args.run_id or f"{recipe.name}/{spec.name}",
                          args.log_dir, local_addr=args.bind)
    run = asyncio.ensure_future(worker.run())

    def cancel() -> None:  # the worker leaves the run on its way out
        run.cancel()

    _on_signals(cancel)
    try:
        final = await run
    except asyncio.CancelledError:
        print(f"worker {rank} stopped by a signal; it left the run", flush=True)
        return
    print(f"worker {rank} done: {final['steps']} steps, {final['samples']} samples",
          flush=True)


def node_command(args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    """The coroutine of a server, worker or launch command, with launcher defaults."""
    try:
        env = from_environ(os.environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.command == "server":
        port = args.port if args.port is not None else env.master_port
        return _serve(args, args.host, port)
    if args.command == "worker":
        url, rank = args.server or env.server_url, args.rank
        rank = env.worker_rank if rank is None else rank
        if url is None or rank is None:
            raise ConfigError("worker needs --server and --rank (or MASTER_ADDR and RANK)")
        return _work(args, url, rank)
    if env.rank is None or env.master_addr is None:
        raise ConfigError("launch needs RANK (or SLURM_PROCID) and MASTER_ADDR")
    spec = _pick_run(load_recipe(args.recipe), args.run)
    if env.world_size is not None and env.world_size != spec.workers + 1:
        raise ConfigError(f"WORLD_SIZE={env.world_size}, but run {spec.name!r} needs "
                          f"{spec.workers} workers + 1 server = {spec.workers + 1} tasks")
    if env.rank == 0:
        return _serve(args, env.master_addr, env.master_port)
    assert env.server_url is not None and env.worker_rank is not None
    return _work(args, env.server_url, env.worker_rank)
