"""Checkpoints: the model, version, optimizer and rule state as an ``.npz`` (no pickle).

Each checkpoint records its run and the model's fingerprint (every state entry's name,
shape and dtype), and a resume refuses another run's or another model's checkpoint, one
that lacks a field, and one holding a NaN or Inf (a server never commits one), with a
message that says which.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncsync.protocols.base import CheckpointError, all_finite

__all__ = ["REQUIRED", "CheckpointError", "load_checkpoint", "model_fingerprint",
           "save_checkpoint"]

REQUIRED = ("w", "version", "elapsed")
ZIP_MAGIC = b"PK\x03\x04"
"""How an ``.npz`` (a zip archive) starts."""


def model_fingerprint(model: torch.nn.Module) -> str:
    """The model's identity for checkpoints: each state entry's name, shape and dtype."""
    return ";".join(f"{name}:{list(t.shape)}:{str(t.dtype).removeprefix('torch.')}"
                    for name, t in model.state_dict().items())


def save_checkpoint(path: Path, run_id: str, fingerprint: str,
                    arrays: dict[str, torch.Tensor]) -> None:
    """Write tensors as an uncompressed ``.npz``, atomically and durably: write a temporary
    file, fsync it, rename it over `path`, fsync the directory. A failure raises `OSError`
    and leaves the last good checkpoint as it was and no temporary file behind."""
    tmp = path.with_name(path.name + ".tmp")
    named: dict[str, Any] = {k: v.numpy() for k, v in arrays.items()}
    try:
        with tmp.open("wb") as handle:
            np.savez(handle, run_id=np.array(run_id), fingerprint=np.array(fingerprint),
                     **named)
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


def _check_declared_sizes(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse an array whose header declares more bytes than its member holds (a damaged
    shape), before numpy allocates what it declares."""
    for member in archive.infolist():
        with archive.open(member) as handle:
            major, _ = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if major == 1
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(handle)
        declared = math.prod(shape) * dtype.itemsize
        if declared > member.file_size:
            raise CheckpointError(f"checkpoint {path}: {member.filename} declares shape "
                                  f"{shape[:4]} of {dtype} ({declared} bytes) in its "
                                  f"{member.file_size} bytes (damaged)")


def load_checkpoint(path: Path, run_id: str, fingerprint: str) -> dict[str, torch.Tensor]:
    """Read a checkpoint written by `save_checkpoint` for the same run and model."""
    labels = ("run_id", "fingerprint")
    try:
        with path.open("rb") as handle:
            start = handle.read(len(ZIP_MAGIC))
        if start != ZIP_MAGIC:
            raise CheckpointError(f"checkpoint {path} is not an .npz archive (it starts "
                                  f"with {start!r}, not {ZIP_MAGIC!r}): damaged, or another "
                                  "file")
        with zipfile.ZipFile(path) as archive:
            _check_declared_sizes(path, archive)
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in (*labels, *REQUIRED) if k not in data.files]
            if missing:
                raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)} (not "
                                      "written by this version of asyncsync, or damaged)")
            saved_run, saved_model = str(data["run_id"]), str(data["fingerprint"])
            arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files
                      if k not in labels}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot read checkpoint {path} (truncated or damaged): "
                              f"{type(exc).__name__}: {exc}") from exc
    if saved_run != run_id:
        raise CheckpointError(f"checkpoint {path} belongs to run {saved_run!r}, not {run_id!r}")
    if saved_model != fingerprint:
        ours, theirs = fingerprint.split(";"), saved_model.split(";")
        first = next((f"{a} here, {b} in the checkpoint"
                      for a, b in zip(ours, theirs, strict=False) if a != b),
                     f"{len(ours)} entries here, {len(theirs)} in the checkpoint")
        raise CheckpointError(f"checkpoint {path} is of another model ({first[:300]})")
    for key, value in arrays.items():
        if value.is_floating_point() and not all_finite(value):
            raise CheckpointError(f"checkpoint {path}: {key} holds NaN or Inf (damaged)")
    return arrays
