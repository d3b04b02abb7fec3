"""A timing-only run with ``device = "cuda"`` computes its stand-in on the CPU.

The stand-in's closed-form gradient keys its memo by its parameters' and batch's bytes,
read on the host (``.numpy()``): on a GPU its first step raised ``TypeError: can't convert
cuda:0 device type tensor to numpy``. No GPU is needed to see it: CUDA is declared present
(``torch.cuda.is_available``), and every device a trainer is given is recorded. Before the
fix the workers were given ``cuda`` (and, here, the first tensor made there raised "Found
no NVIDIA driver").
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncsync.training import trainer as trainer_module
from tests.test_s10_virt_study import simulated, spec_of

RECIPE = """
name = "virt"
[defaults]
workers = 3
clock = "virtual"
device = "DEVICE"
model = {name = "timing", size_mb = 1}
stop = {time_s = 1}
compute = {base_step_s = 0.1, batched = "BATCHED"}
[[runs]]
name = "asp"
protocol = "asp"
"""


def _cuda_declared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Declare one CUDA device present; returns the device names trainers are given."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    given: list[str] = []
    resolve = trainer_module.resolve_device

    def recording(name: str) -> torch.device:
        given.append(name)
        return resolve(name)

    monkeypatch.setattr(trainer_module, "resolve_device", recording)
    return given


@pytest.mark.parametrize("batched", ["auto", "on", "off"])
def test_a_timing_run_on_cuda_computes_on_the_cpu_as_a_cpu_run_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: str) -> None:
    recipe = RECIPE.replace("BATCHED", batched)
    cpu = simulated(spec_of(tmp_path, "asp", recipe.replace("DEVICE", "cpu")),
                    tmp_path / "cpu")
    given = _cuda_declared(monkeypatch)
    cuda = simulated(spec_of(tmp_path, "asp", recipe.replace("DEVICE", "cuda")),
                     tmp_path / "cuda")
    assert given == ["cpu"] * 3  # the three workers' trainers
    assert cuda["worker_math"] == cpu["worker_math"] == "one-by-one"
    assert not cuda.get("worker_math_fallback")
    logs = sorted(p.name for p in (tmp_path / "cpu").glob("*.jsonl"))
    assert logs
    for name in logs:
        assert (tmp_path / "cuda" / name).read_bytes() == (tmp_path / "cpu" / name).read_bytes()
