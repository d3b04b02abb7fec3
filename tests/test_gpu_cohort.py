"""Batched worker math on a real GPU: the same steps as one by one, within the bound.

Skipped where CUDA is absent; on a GPU host run ``pytest tests/test_gpu_cohort.py``. The
paths changed since the last GPU run (padding and its probe, frozen parameters, one-sample
BatchNorm, chunks of `ROW_BUDGET`, momentum of its own, uneven local epochs) run here on
CUDA, through the device-generic checks the CPU suite runs on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from asyncsync.engine.cohort import Cohort
from asyncsync.study import simulation
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import ScratchGradients
from tests.helpers import tiny_bn_cnn
from tests.test_cohort import (
    RECIPE,
    _agree,
    _compare,
    _records,
    _round,
    _run,
    _trainers,
    assert_logs_agree,
    gathered_rows_equal_stacked_batches,
)
from tests.test_s8_fedavg_recipe import RECIPE as EPOCHS_RECIPE
from tests.test_s10_gpuside_device_paths import (
    chunked_calls_on,
    frozen_parameters_on,
    momentum_of_its_own_on,
    one_sample_batchnorm_on,
    padded_unequal_batches_on,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: batched math on the device")


@pytest.fixture
def float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN convolutions round through TF32 by default (10 mantissa bits): the cohort
    bound holds for float32 arithmetic, so the comparisons turn it off (matmuls keep
    torch's default, full float32: ``torch.get_float32_matmul_precision() == "highest"``)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.usefixtures("float32")
@pytest.mark.parametrize("check", [padded_unequal_batches_on, frozen_parameters_on,
                                   one_sample_batchnorm_on, momentum_of_its_own_on])
def test_the_paths_changed_since_the_last_gpu_run_agree_on_the_gpu(
        check: Callable[[str], None]) -> None:
    """Batched on CUDA against one by one on the CPU: padding (and its probe on the
    template's CPU copy), frozen parameters, one-sample BatchNorm, momentum of its own."""
    check("cuda")


@pytest.mark.usefixtures("float32")
def test_calls_chunked_by_the_row_budget_agree_on_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chunked_calls_on("cuda", monkeypatch)


@pytest.mark.usefixtures("float32")
@pytest.mark.parametrize("name", ["mlp", "bn_cnn"])
def test_uneven_local_epochs_batched_on_the_gpu_equal_one_by_one(tmp_path: Path,
                                                                  name: str) -> None:
    """FedAvg's local_epochs over unequal shards on CUDA: unequal step counts and short
    last batches, padded (the mlp) or called apart (BatchNorm)."""
    recipe = EPOCHS_RECIPE.replace('clock = "virtual"', 'clock = "virtual"\ndevice = "cuda"')
    runs = {}
    for batched in ("on", "off"):
        path = tmp_path / f"{batched}.toml"
        path.write_text(recipe.replace("BATCHED", batched))
        run_dir = tmp_path / batched
        run_dir.mkdir()
        runs[batched] = run_dir, simulate(load_recipe(path).run(name), run_dir, name)
    (on_dir, on), (off_dir, off) = runs["on"], runs["off"]
    assert on["worker_math"] == "batched" and on["worker_math_device"].startswith("cuda")
    assert off["worker_math"] == "one-by-one"
    assert on["batched_steps"] > on["batched_calls"] > 0
    records = assert_logs_agree(on_dir, off_dir)
    assert sum(r["event"] == "compute" and r["samples"] < 150 for r in records) > 3


@pytest.mark.parametrize("batched", ["on", "off"])
def test_two_runs_on_the_gpu_give_identical_logs(tmp_path: Path, batched: str) -> None:
    """Deterministic on a GPU too (with TF32 as a user gets it), batched and one by one: a
    virtual run asks cuDNN for deterministic kernels (a convolution's backward may
    otherwise sum with atomics)."""
    recipe = RECIPE.replace('clock = "virtual"', 'clock = "virtual"\ndevice = "cuda"')
    first, _ = _run(tmp_path, "esync", batched, "a", recipe)
    second, _ = _run(tmp_path, "esync", batched, "b", recipe)
    for path in sorted(first.glob("*.jsonl")):
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name


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


def test_one_by_one_local_steps_on_the_gpu_reuse_one_borrowed_gradient(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' device names its index, as their gradients' does: a gradient given
    back is lent again (tests/test_s12_gpuaudit_scratch_device.py, on the CPU)."""
    made: list[int] = []

    class Counting(ScratchGradients):
        def take(self, numel: int, device: torch.device) -> torch.Tensor:
            free = sum(len(vectors) for vectors in self._free.values())
            vector = super().take(numel, device)
            if sum(len(vectors) for vectors in self._free.values()) == free:
                made.append(numel)
            return vector

    monkeypatch.setattr(simulation, "ScratchGradients", Counting)
    recipe = RECIPE.replace('clock = "virtual"', 'clock = "virtual"\ndevice = "cuda"')
    run_dir, facts = _run(tmp_path, "local_sgd", "off", "one", recipe)
    assert facts["worker_math"] == "one-by-one"
    steps = sum(r.get("event") == "compute" for records in _records(run_dir).values()
                for r in records)
    assert steps > 3
    assert len(made) == 1, f"{len(made)} gradients made for {steps} local steps"
