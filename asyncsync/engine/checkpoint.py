"""Checkpoints: the model, version, optimizer and rule state as an ``.npz`` (no pickle)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or belongs to another run or model."""


def save_checkpoint(path: Path, run_id: str, arrays: dict[str, torch.Tensor]) -> None:
    """Write tensors as an uncompressed ``.npz``, atomically and durably: write a temporary
    file, fsync it, rename it over `path`, fsync the directory. A failure raises `OSError`
    and leaves the last good checkpoint as it was and no temporary file behind."""
    tmp = path.with_name(path.name + ".tmp")
    named: dict[str, Any] = {k: v.numpy() for k, v in arrays.items()}
    try:
        with tmp.open("wb") as handle:
            np.savez(handle, run_id=np.array(run_id), **named)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, run_id: str) -> dict[str, torch.Tensor]:
    """Read a checkpoint written by `save_checkpoint` for the same run."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files if k != "run_id"}
            saved_run = str(data["run_id"])
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if saved_run != run_id:
        raise CheckpointError(f"checkpoint {path} belongs to run {saved_run!r}, not {run_id!r}")
    return arrays
