"""One run of a study: its folder, its execution on either clock, and its summary.

A run's folder starts as its resolved ``recipe.json`` (`prepare_folder`); `run_and_record`
runs it (a virtual run in a thread of its own, a real run as processes) and writes its
``summary.json``, also when it fails or is interrupted.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncsync.results.report import summarize_run
from asyncsync.schema import ConfigError
from asyncsync.study.assembly import dataset_loader
from asyncsync.study.dashboard import Dashboard
from asyncsync.study.executors import cause, error_line, write_summary
from asyncsync.study.nodes import run_nodes
from asyncsync.study.recipe import Recipe
from asyncsync.study.simulation import calibrate_step_s, simulate
from asyncsync.study.specs import RunSpec
from asyncsync.training.catalog import DatasetMissing
from asyncsync.training.data import Dataset
from asyncsync.training.dataset_files import DatasetFileError
from asyncsync.training.models import build_model
from asyncsync.training.trainer import resolve_device


async def _run_one(spec: RunSpec, recipe: Recipe, run_dir: Path, dashboard: Dashboard,
                   index: int, repeat: int = 0) -> dict[str, Any]:
    prepare_folder(spec, recipe, run_dir, repeat)
    if spec.clock == "virtual":
        return await _run_virtual(spec, run_dir, f"{recipe.name}/{spec.name}", dashboard, index,
                                  repeat)
    await run_nodes(spec, recipe.name, run_dir,
                    lambda status: dashboard.update(spec, index, status, repeat))
    return {**summarize_run(run_dir), **spec.population().facts()}


_CALIBRATED: dict[str, float] = {}


def calibrated_step_s(spec: RunSpec) -> float:
    """The base step time of a virtual run, measured once per model, data and batch size in
    this process (so the runs of a recipe are charged alike)."""
    key = json.dumps([spec.model.name, spec.model.options, spec.data.name,
                      spec.data.batch_size], sort_keys=True)
    if key not in _CALIBRATED:
        _CALIBRATED[key] = calibrate_step_s(spec)
    return _CALIBRATED[key]


class _Cancelled(Exception):
    """Raised in a simulation's thread to stop it: its run was cancelled."""


async def _run_virtual(spec: RunSpec, run_dir: Path, run_id: str, dashboard: Dashboard,
                       index: int, repeat: int) -> dict[str, Any]:
    """Simulate the run in a thread of its own (its loop is virtual); show its progress.

    Cancelled (Ctrl-C, SIGTERM), it stops the simulation at its next status (at most a
    virtual second or `simulation.WATCH_REAL_S` real seconds away, and one step) and
    waits for that (the thread would otherwise run to the end of the budget, and the
    process with it)."""
    calibrated = await calibration(spec, dashboard)
    latest: list[dict[str, Any]] = []
    cancelled = threading.Event()

    def sink(status: dict[str, Any]) -> None:  # called from the simulation's thread
        if cancelled.is_set():
            raise _Cancelled
        latest[:] = [status]

    job = asyncio.ensure_future(asyncio.to_thread(simulate, spec, run_dir, run_id, sink,
                                                  calibrated))
    try:
        while not job.done():
            if latest:
                dashboard.update(spec, index, latest[0], repeat)
            await asyncio.wait({job}, timeout=0.5)
    except asyncio.CancelledError:
        cancelled.set()
        await asyncio.wait({job})
        job.exception()  # retrieved: _Cancelled, or what ended it first
        raise
    facts = job.result()  # first: a run that failed has no logs to summarize
    if latest:  # its last status (a short run may end between two refreshes)
        dashboard.update(spec, index, latest[0], repeat)
    return {**summarize_run(run_dir), **facts}


def check_data(recipe: Recipe, data: Callable[[RunSpec], Dataset] | None = None) -> None:
    """Load every dataset the recipe's runs read from disk, once each (through `data`, a
    `dataset_loader` the caller's other checks share, if given).

    Raises:
        DatasetMissing: one is absent (the error names the expected path).
    """
    load = data or dataset_loader()
    for spec in recipe.runs:
        if spec.data.name != "synthetic":
            _dataset(recipe, load, spec)


def _dataset(recipe: Recipe, load: Callable[[RunSpec], Dataset], spec: RunSpec) -> Dataset:
    """`load(spec)`; its files absent or malformed are named with the recipe file, the run
    and the key that points at them (``data.root``).

    Raises:
        DatasetMissing: they are absent.
        DatasetFileError: one is malformed.
    """
    try:
        return load(spec)
    except (DatasetMissing, DatasetFileError) as exc:
        where = f"{recipe.source}: " if recipe.source else ""
        raise type(exc)(f"{where}{spec.name}: data.root: {exc}") from None


def check_models(recipe: Recipe, data: Callable[[RunSpec], Dataset] | None = None) -> None:
    """Build every ``module:callable`` model the recipe's runs name, once per model, options
    and dataset shape, and refuse one that cannot be imported, rejects its options or does
    not fit its dataset (`asyncsync.training.models.build_model`'s check of one batch).
    The shipped models fit by construction and are not built.

    Datasets come from `data` (as in `check_data`).

    Raises:
        ConfigError: a model that does not do (the recipe file, the run and the key named).
    """
    load = data or dataset_loader()
    built = set()
    for spec in recipe.runs:
        name = spec.model.name
        if ":" not in name:
            continue
        where = f"{recipe.source}: " if recipe.source else ""
        module, _, attr = name.partition(":")
        try:
            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{where}{spec.name}: model.name: {name!r} cannot be "
                              f"imported ({exc}); a module is looked up in the working "
                              "directory, then in the installed packages") from None
        dataset = _dataset(recipe, load, spec)
        shape = (dataset.input_shape, dataset.num_classes)
        key = json.dumps([name, spec.model.options, *shape], sort_keys=True)
        if key in built:
            continue
        built.add(key)
        with torch.random.fork_rng(devices=[]):  # the process's draws stay as they were
            try:
                build_model(name, *shape, spec.model.options)
            except ValueError as exc:
                raise ConfigError(f"{where}{spec.name}: model: {exc}") from None


def device_problem(recipe: Recipe) -> str | None:
    """Why this host cannot run some of the recipe's runs on their ``device`` (None: it
    can), naming the recipe file, the key and the runs."""
    problems: dict[str, list[str]] = {}
    for spec in recipe.runs:
        try:
            resolve_device(spec.device)
        except ValueError as exc:
            problems.setdefault(str(exc), []).append(spec.name)
    where = f"{recipe.source}: " if recipe.source else ""
    return "; ".join(f"{where}device: {problem} (runs: {', '.join(names)})"
                     for problem, names in problems.items()) or None


def check_devices(recipe: Recipe) -> None:
    """Refuse, before any run starts, runs whose ``device`` this host lacks (run here, each
    would fail on its own, a real run's server with a traceback in its log).

    Raises:
        ConfigError: `device_problem`'s reason.
    """
    problem = device_problem(recipe)
    if problem:
        raise ConfigError(f'{problem}; use device = "cpu", or "auto" for CUDA where there is '
                          "one")


async def run_and_record(spec: RunSpec, recipe: Recipe, run_dir: Path, dashboard: Dashboard,
                         index: int, repeat: int) -> dict[str, Any]:
    """Run one run and write its folder; returns its summary.

    A run that raises gets a summary.json with its error's first line (a run that failed
    before it started leaves no folder); one cut short by Ctrl-C or SIGTERM gets one with
    ``interrupted: true`` and which it was (`asyncsync.study.executors.cause`), and the
    cancellation goes on.
    """
    failed = {"recipe": recipe.name, "run": spec.name, "protocol": spec.protocol.name,
              "repeat": repeat, "seed": spec.seed, "sweep": spec.sweep, "clock": spec.clock}
    try:
        summary = await _run_one(spec, recipe, run_dir, dashboard, index, repeat)
    except Exception as exc:
        summary = {**failed, "error": error_line(exc)}
    except asyncio.CancelledError as exc:
        if run_dir.is_dir():
            write_summary(run_dir, {**failed, "error": cause(exc), "interrupted": True})
        raise
    if run_dir.is_dir():
        write_summary(run_dir, summary)
    return summary


def prepare_folder(spec: RunSpec, recipe: Recipe, run_dir: Path, repeat: int) -> None:
    """The run's folder with its resolved recipe.json: all a run needs to run (loadable:
    its baseline is the run's name in the recipe, without its sweep point)."""
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": recipe.name, "baseline": spec.base_name, "repeat": repeat,
         "runs": [spec.as_table()]},
        indent=2))


async def calibration(spec: RunSpec, dashboard: Dashboard) -> float | None:
    """The host-measured step time of a run whose base_step_s is "calibrate", else None."""
    if not spec.compute.calibrate:
        return None
    calibrated = await asyncio.to_thread(calibrated_step_s, spec)
    dashboard.console.print(
        f"{spec.name}: calibrated base_step_s = {calibrated:.4g} s on this host "
        f"(host-dependent); pin it with --set compute.base_step_s={calibrated:.4g}",
        soft_wrap=True)
    return calibrated
