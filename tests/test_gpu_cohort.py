"""Batched worker math on a real GPU: the same steps as one by one, within the bound.

Skipped where CUDA is absent; on a GPU host run ``pytest tests/test_gpu_cohort.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncsync.engine.cohort import Cohort
from asyncsync.training.batched import BatchedModel
from tests.helpers import tiny_bn_cnn
from tests.test_cohort import (
    RECIPE,
    _agree,
    _compare,
    _round,
    _run,
    _trainers,
    gathered_rows_equal_stacked_batches,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: batched math on the device")


def test_batched_steps_on_the_gpu_equal_one_by_one_steps_on_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # cuDNN convolutions round through TF32 by default (10 mantissa bits): the bound holds
    # for float32 arithmetic, so the comparison turns it off
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(0)
    model = tiny_bn_cnn((1, 8, 8), 3)
    one, on_gpu = _trainers(model, 3, 0.9), _trainers(model, 3, 0.9, "cuda")
    cohort = Cohort(BatchedModel(model, torch.device("cuda")))
    for _ in range(3):
        works = [dict(batch_size=8, local=True)] * 3
        _agree(_round(one, None, works), _round(on_gpu, cohort, works))
    _compare(one, on_gpu)


def test_a_virtual_run_on_cuda_batches_by_default_from_8_workers(tmp_path: Path) -> None:
    recipe = RECIPE.replace('clock = "virtual"', 'clock = "virtual"\ndevice = "cuda"')
    _, facts = _run(tmp_path, "nbsync", "auto", "three", recipe)
    assert facts["worker_math"] == "one-by-one"
    assert "3 worker(s): a batched call pays from 8 workers" in facts["worker_math_reason"]
    recipe = recipe.replace("workers = 3", "workers = 8")
    _, facts = _run(tmp_path, "nbsync", "auto", "eight", recipe, "[1, 2, 3, 1, 2, 3, 1, 2]")
    assert facts["worker_math"] == "batched"
    assert facts["worker_math_device"].startswith("cuda")
    assert facts["batched_steps"] > facts["batched_calls"] > 0


def test_batches_gathered_on_the_gpu_are_the_stacked_batches_to_the_bit() -> None:
    gathered_rows_equal_stacked_batches("cuda")
