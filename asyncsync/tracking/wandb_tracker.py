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

from asyncsync.tracking.base import Point, RunInfo, TrackingError, require

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
    """Logs each run to W&B project `project`; files under `directory`/wandb."""

    def __init__(self, project: str = "asyncsync", directory: Path = Path(),
                 mode: str | None = None) -> None:
        self._wandb = require("wandb", "wandb")
        self.project = project
        self.directory = directory
        self.mode = mode or os.environ.get("WANDB_MODE", "offline")
        self._run: Any = None
        self._skip = 0

    def offline_dirs(self, run: RunInfo) -> list[Path]:
        """The offline folders of `run` under the directory."""
        return sorted((self.directory / "wandb").glob(f"offline-run-*-{wandb_id(run)}"))

    def start(self, run: RunInfo) -> None:
        """Open the run (replacing its offline copy, or resuming it online)."""
        if self.mode == "offline":
            for old in self.offline_dirs(run):
                shutil.rmtree(old)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._run = self._wandb.init(
            project=self.project, dir=str(self.directory), id=wandb_id(run),
            name=f"{run.stamp}/{run.name}/r{run.repeat}", group=run.group,
            job_type=run.name, tags=[f"seed={run.seed}", run.recipe],
            config={**run.config, "run_id": run.run_id, "repeat": run.repeat},
            resume=None if self.mode == "offline" else "allow", mode=self.mode,
            settings=self._wandb.Settings(console="off", x_disable_stats=True, silent=True))
        self._run.define_metric("version")
        self._run.define_metric("*", step_metric="version")
        self._skip = self._run.starting_step if self._run.resumed else 0

    def log(self, point: Point, wall: float) -> None:
        """One history row: the metrics and ``version`` (rows already sent are skipped)."""
        if self._skip:
            self._skip -= 1
            return
        self._open().log({"version": point.step, **point.metrics})

    def finish(self, summary: dict[str, float], step: int) -> None:
        """The summary's figures in the run's summary; ends the run."""
        run = self._open()
        run.summary.update({**summary, "version": step})
        run.finish()
        self._run = None

    def close(self) -> None:
        """End a run left open."""
        if self._run is not None:
            self._run.finish()
            self._run = None

    def _open(self) -> Any:
        if self._run is None:
            raise TrackingError("wandb: log() or finish() before start()")
        return self._run
