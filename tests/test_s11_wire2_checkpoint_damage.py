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


BAD_FIELDS = {
    "version": ("version", torch.tensor(-3)),
    "versions": ("version", torch.tensor([1, 2])),
    "elapsed": ("elapsed", torch.tensor(-1.0, dtype=torch.float64)),
    "momentum": ("momentum", torch.zeros(5)),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
async def test_a_checkpoint_field_out_of_range_is_refused_and_the_server_is_untouched(
        tmp_path: Path, case: str) -> None:
    """A field no server writes (a negative version or time, a momentum of another shape)
    is refused by name; the server's model and version stay as they were (a momentum of
    another shape used to be taken, and every push then failed in the optimizer)."""
    from asyncsync.engine.core import build_core
    from asyncsync.engine.settings import ServerSettings
    from tests.helpers import tiny_model

    core = build_core(tiny_model(), "asp", 1, ServerSettings(run_id=RUN, momentum=0.9))
    before = core.store.w.clone()
    key, value = BAD_FIELDS[case]
    arrays = {"w": torch.ones_like(before), "version": torch.tensor(7),
              "elapsed": torch.tensor(2.0, dtype=torch.float64),
              "momentum": torch.zeros(core.store.num_params), key: value}
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, RUN, core.run.fingerprint, arrays)
    try:
        with pytest.raises(CheckpointError, match=rf"checkpoint .*checkpoint\.npz.*{key}"):
            core.resume(path)
    finally:
        await core.stop()
        await core.close()
    assert core.store.version == 0
    assert torch.equal(core.store.w, before)
    assert core.store.optimizer.momentum_buffer is None
