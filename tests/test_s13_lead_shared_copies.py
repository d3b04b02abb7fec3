"""A virtual run's trainers move their vectors through one set of device copies.

On CUDA each trainer had its own side stream and pinned staging buffers: each of 1,000
FedAvg clients made a pinned allocation at its first exchange (1.1 s of a 13 s profile of
20 rounds on an H200 host) and kept two buffers for good. Staging is tried here with the
fake streams of `tests/test_device_copies.py`, which run on CPU tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from asyncsync.training import trainer as trainer_module
from asyncsync.training.device_copies import STAGING_BUFFERS, StagedCopies
from asyncsync.training.trainer import Trainer, share_copies
from tests.helpers import tiny_data, tiny_model
from tests.test_device_copies import FakeStreams

RECIPE = """
name = "shared"
[defaults]
workers = 12
clock = "virtual"
[defaults.stop]
time_s = 6
[defaults.model]
name = "mlp"
options = { hidden = 8 }
[defaults.data]
batch_size = 8
[defaults.eval]
interval_s = 2
[defaults.compute]
base_step_s = 0.01
[defaults.network]
bandwidth_mbps = 20
latency_ms = 40
[[runs]]
name = "fedavg"
protocol = { name = "fedavg", local_steps = 3, fraction = 0.5 }
"""


def staged_trainers(count: int) -> tuple[list[Trainer], list[FakeStreams]]:
    """Trainers whose copies stage as on CUDA, each through streams of its own."""
    x, y = tiny_data()
    trainers, streams = [], []
    for _ in range(count):
        trainer = Trainer(tiny_model(), lambda size: (x[:size], y[:size]), device="cpu")
        streams.append(FakeStreams())
        trainer.copies = StagedCopies(streams[-1], trainer.numel)
        trainers.append(trainer)
    return trainers, streams


def test_shared_trainers_stage_through_two_pinned_buffers_and_each_gets_its_vector() -> None:
    trainers, streams = staged_trainers(10)
    share_copies(trainers)
    vectors = [torch.full((trainers[0].numel,), float(rank)) for rank in range(10)]
    for trainer, vector in zip(trainers, vectors, strict=True):
        trainer.load(vector)
    for fake in streams:
        fake.drain()
    pinned = sum(fake.log.count("pinned") for fake in streams)
    assert pinned <= STAGING_BUFFERS  # each trainer's own copies allocated (10 before)
    for trainer, vector in zip(trainers, vectors, strict=True):
        assert torch.equal(trainer.flat, vector)


def test_trainers_on_two_devices_share_within_each_device_only() -> None:
    trainers, _ = staged_trainers(2)
    other = Trainer(tiny_model(), trainers[0].batches, device="meta")
    share_copies([trainers[0], other, trainers[1]])
    assert trainers[1].copies is trainers[0].copies
    assert other.copies is not trainers[0].copies


def _logs(run_dir: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(run_dir.glob("*.jsonl"))}


def test_a_virtual_run_stages_through_one_copier_and_logs_what_plain_copies_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    spec = load_recipe(path).runs[0]
    for name in ("plain", "staged"):
        (tmp_path / name).mkdir()
    simulate(spec, tmp_path / "plain", "same")  # the id travels in headers, charged
    made: list[StagedCopies] = []
    used: set[int] = set()

    def fake_cuda_copies(device: torch.device, numel: int) -> StagedCopies:
        copies = StagedCopies(FakeStreams(), numel)
        stage = copies.stage

        def recorded(vector: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            used.add(id(copies))
            return stage(vector, out)

        copies.stage = recorded  # type: ignore[method-assign]
        made.append(copies)
        return copies

    monkeypatch.setattr(trainer_module, "copies_for", fake_cuda_copies)
    simulate(spec, tmp_path / "staged", "same")
    assert len(made) >= 12  # one a trainer was made (and the server's model has none)
    assert len(used) == 1, f"{len(used)} trainers' own copies staged vectors"
    assert _logs(tmp_path / "staged") == _logs(tmp_path / "plain")
