"""Damaged checkpoints are refused with an error naming the file and the problem, never a
MemoryError or a traceback, and the file is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncsync.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

RUN, MODEL = "damaged", "0.weight:[1000]:float32"


def saved(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, RUN, MODEL, {"w": torch.zeros(1000), "version": torch.tensor(3),
                                       "elapsed": torch.tensor(1.5)})
    return path, path.read_bytes()


def test_a_checkpoint_whose_array_header_claims_terabytes_is_refused(tmp_path: Path) -> None:
    """A damaged shape in an array's header (within its padding, so the archive's layout
    holds) would make numpy allocate what the header says before any check."""
    path, raw = saved(tmp_path)
    start = raw.index(b"(1000,)")
    end = raw.index(b"\n", start)
    claim = b"(999999999999,), }"
    damaged = raw[:start] + claim.ljust(end - start) + raw[end:]
    assert len(damaged) == len(raw)
    path.write_bytes(damaged)
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.npz.*w\.npy"):
        load_checkpoint(path, RUN, MODEL)
    assert path.read_bytes() == damaged


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.99])
def test_a_truncated_checkpoint_is_refused_naming_it(tmp_path: Path, cut: float) -> None:
    path, raw = saved(tmp_path)
    path.write_bytes(raw[: int(len(raw) * cut)])
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.npz"):
        load_checkpoint(path, RUN, MODEL)


def test_a_checkpoint_of_another_model_is_refused_naming_both(tmp_path: Path) -> None:
    path, _ = saved(tmp_path)
    with pytest.raises(CheckpointError, match=r"another model \(0\.weight:\[999\]"):
        load_checkpoint(path, RUN, "0.weight:[999]:float32")
