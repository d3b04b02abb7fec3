"""Weights & Biases, offline by default (``WANDB_MODE=offline``): ``wandb sync`` uploads later.

A run's W&B id comes from its run id, its ``group`` is what its repeats share, and its
charts use the server's version (``version``) as their x axis. Offline, exporting a run
again replaces its offline folder under ``<dir>/wandb/``; online, the run is resumed by id
and only the rows it lacks are sent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from asyncsync.tracking.base import Point, RunInfo, opened, require

ID_LENGTH = 64
"""The longest W&B run id used."""


def wandb_id(run: RunInfo) -> str:
    """A W&B run id for `run`: its slug, shortened with a hash of the run id if too long."""
    slug = run.slug()
    if len(slug) <= ID_LENGTH:
        return slug
    digest = hashlib.sha256(run.run_id.encode()).hexdigest()[:8]
    return f"{slug[:ID_LENGTH - 9]}-{digest}"


class WandbTracker:
    """Logs each run to W&B project `project`; files under `directory`/wandb.

    A relative `directory` is taken from the folder current when each run starts, and
    handed to W&B resolved: its service process keeps the folder it started in.
    """

    def __init__(self, project: str = "asyncsync", directory: Path = Path(),
                 mode: str | None = None) -> None:
        self._wandb = require("wandb", "wandb")
        self.project = project
        self.directory = directory
        self.mode = mode or os.environ.get("WANDB_MODE", "offline")
        self.label = f"tracking to wandb project {project} ({self.mode})"
        self._runs: dict[str, Any] = {}  # asyncsync run id -> open W&B run
        self._skip: dict[str, int] = {}  # history rows W&B already has, per run

    def offline_dirs(self, run: RunInfo) -> list[Path]:
        """The offline folders of `run` under the directory."""
        return sorted((self.directory / "wandb").glob(f"offline-run-*-{wandb_id(run)}"))

    def start(self, run: RunInfo) -> None:
        """Open the run (replacing its offline copy, or resuming it online); other runs
        stay open beside it."""
        if self.mode == "offline":
            for old in self.offline_dirs(run):
                shutil.rmtree(old)
        self.directory.mkdir(parents=True, exist_ok=True)
        wb_run = self._wandb.init(
            project=self.project, dir=str(self.directory.resolve()), id=wandb_id(run),
            name=f"{run.stamp}/{run.name}/r{run.repeat}", group=run.group,
            job_type=run.name, tags=[f"seed={run.seed}", run.recipe],
            config={**run.config, "run_id": run.run_id, "repeat": run.repeat},
            resume=None if self.mode == "offline" else "allow", mode=self.mode,
            reinit="create_new",
            settings=self._wandb.Settings(console="off", x_disable_stats=True, silent=True))
        wb_run.define_metric("version")
        wb_run.define_metric("*", step_metric="version")
        self._runs[run.run_id] = wb_run
        self._skip[run.run_id] = wb_run.starting_step if wb_run.resumed else 0

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        """One history row: the metrics and ``version`` (rows already sent are skipped)."""
        wb_run = opened(self._runs, run, "wandb")
        if self._skip[run.run_id]:
            self._skip[run.run_id] -= 1
            return
        wb_run.log({"version": point.step, **point.metrics})

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        """The summary's figures in the run's summary; ends the run."""
        wb_run = opened(self._runs, run, "wandb")
        wb_run.summary.update({**summary, "version": step})
        wb_run.finish()
        del self._runs[run.run_id], self._skip[run.run_id]

    def close(self) -> None:
        """End the runs left open."""
        for wb_run in self._runs.values():
            wb_run.finish()
        self._runs.clear()
        self._skip.clear()
