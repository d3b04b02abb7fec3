"""A checkpoint of another run, or one without its clock, is refused by name (found by
mutation testing of `engine.checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncsync.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

STATE = {"w": torch.tensor([1.0, -2.0]), "version": torch.tensor(3),
         "elapsed": torch.tensor(4.5)}


def test_a_checkpoint_is_read_back_as_written(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.npz", "run-a", "w:[2]:float32", STATE)
    loaded = load_checkpoint(tmp_path / "c.npz", "run-a", "w:[2]:float32")
    assert {k: v.tolist() for k, v in loaded.items()} == {"w": [1.0, -2.0], "version": 3,
                                                           "elapsed": 4.5}


def test_another_runs_checkpoint_is_refused_naming_both_runs(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.npz", "run-a", "w:[2]:float32", STATE)
    with pytest.raises(CheckpointError, match="belongs to run 'run-a', not 'run-b'"):
        load_checkpoint(tmp_path / "c.npz", "run-b", "w:[2]:float32")


def test_a_checkpoint_without_its_clock_is_refused_naming_the_field(tmp_path: Path) -> None:
    without = {k: v for k, v in STATE.items() if k != "elapsed"}
    save_checkpoint(tmp_path / "c.npz", "run-a", "w:[2]:float32", without)
    with pytest.raises(CheckpointError, match="lacks elapsed"):
        load_checkpoint(tmp_path / "c.npz", "run-a", "w:[2]:float32")
