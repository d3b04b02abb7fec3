"""A virtual run's process asks cuDNN for deterministic kernels, chosen without timing
them, so that two runs of one recipe on one GPU give the same bytes (the GPU comparison
itself is tests/test_gpu_cohort.py's; here, that the run sets what it needs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_s10_virt_study import simulated, spec_of

RECIPE = """
name = "virt"
[defaults]
workers = 2
clock = "virtual"
model = {name = "timing", size_mb = 1}
stop = {time_s = 1}
compute = {base_step_s = 0.1}
[[runs]]
name = "asp"
protocol = "asp"
"""


def test_a_virtual_run_asks_cudnn_for_deterministic_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    simulated(spec_of(tmp_path, "asp", RECIPE), tmp_path / "run")
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
