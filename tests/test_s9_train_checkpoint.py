"""A checkpoint file cut short or altered is refused with a `CheckpointError` naming it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from asyncsync.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def flip_byte_in_payload(raw: bytes) -> bytes:
    at = len(raw) // 3  # inside w's bytes, well past the zip's first header
    return raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "cut in half": (lambda raw: raw[: len(raw) // 2], "truncated or damaged"),
    "end cut off": (lambda raw: raw[:-10], "truncated or damaged"),
    "empty": (lambda raw: b"", "is not an .npz archive"),
    "a byte flipped": (flip_byte_in_payload, "Bad CRC-32"),
    "another file": (lambda raw: b"\x80\x04K\x01." + raw, "is not an .npz archive"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_checkpoint_file_is_a_checkpoint_error(tmp_path: Path, case: str) -> None:
    damage, problem = DAMAGE[case]
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, "run", "model", {"w": torch.arange(4000.0),
                                           "version": torch.tensor(7),
                                           "elapsed": torch.tensor(1.5)})
    assert load_checkpoint(path, "run", "model")["version"].item() == 7
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, "run", "model")
    assert str(path) in str(err.value) and problem in str(err.value)
