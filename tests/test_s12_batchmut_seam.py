"""The batched seam and the path choice where the other tests do not look: an adoption
deferred mid-step, the slowdown a filed step reports, and a timing-model run that asks
for batching (its one-by-one path is the expected one, not a fallback)."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest
import torch
from torch import nn

from asyncsync.clock import VirtualTimeLoop, sleep
from asyncsync.engine.cohort import Cohort, CohortWorkerSeam
from asyncsync.engine.compute import Charged
from asyncsync.engine.work import LocalWork
from asyncsync.hetero.compute import FixedStepCost, StaticSlowdown
from asyncsync.study.hetero_specs import ComputeSpec
from asyncsync.study.specs import TIMING_MODEL, ModelSpec, RunSpec
from asyncsync.study.worker_math import auto_refusal, choose_worker_math, with_index
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import Trainer


def _batches(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(size)
    return torch.randn(size, 1, 4, 4, generator=gen), torch.randint(3, (size,), generator=gen)


def _seam_and_trainer(slowdown: float) -> tuple[CohortWorkerSeam, Trainer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    trainer = Trainer(copy.deepcopy(model), _batches, lr=0.1, device="cpu")
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    return CohortWorkerSeam(StaticSlowdown(slowdown), FixedStepCost(0.05, 8), cohort), trainer


def test_an_adoption_deferred_mid_step_comes_after_the_step() -> None:
    """A pull adopted while a step is filed (no snapshot in between): the step computes
    on the model its worker had when it began, then the adopted model replaces it, as on
    the one-by-one seam. So the worker ends holding the adopted model (zeros) exactly."""
    seam, trainer = _seam_and_trainer(1.0)

    async def mid_step() -> torch.Tensor:
        seam.start()
        step = asyncio.create_task(seam.step(LocalWork(trainer, 8, local=True), batch=8))
        await sleep(0.01)
        seam.defer(trainer.load, torch.zeros(trainer.numel))
        await step
        return trainer.flat.clone()

    loop = VirtualTimeLoop()
    try:
        held = loop.run_until_complete(mid_step())
    finally:
        loop.close()
    assert torch.equal(held, torch.zeros(trainer.numel))


def test_a_filed_step_is_charged_its_slowed_time_and_reports_its_factor() -> None:
    """0.05 s for 8 samples, 16 samples, slowed 3x: 0.3 s, and a factor of 3."""
    seam, trainer = _seam_and_trainer(3.0)

    async def one_step() -> tuple[Charged, float]:
        seam.start()
        charged = await seam.step(LocalWork(trainer, 16, local=True), batch=16)
        return charged, asyncio.get_running_loop().time()

    loop = VirtualTimeLoop()
    try:
        charged, ended = loop.run_until_complete(one_step())
    finally:
        loop.close()
    assert charged.seconds == pytest.approx(0.3) and ended == pytest.approx(0.3)
    assert charged.factor == pytest.approx(3.0)


def test_a_timing_model_run_asked_to_batch_computes_one_by_one_without_a_fallback(
        caplog: pytest.LogCaptureFixture) -> None:
    """The timing model's gradient is a closed form: one by one is its path, said at INFO,
    and summary.json must not record a fallback (a study would flag the run)."""
    spec = RunSpec(name="t", clock="virtual", model=ModelSpec(name=TIMING_MODEL, size_mb=1.0),
                   compute=ComputeSpec(base_step_s=0.05, batched="on"))

    def never(*_: object) -> object:
        raise AssertionError("the timing model is never probed")

    with caplog.at_level(logging.INFO, logger="asyncsync.simulation"):
        chosen = choose_worker_math(spec, never, never)  # type: ignore[arg-type]
    assert chosen.facts() == {
        "worker_math": "one-by-one",
        "worker_math_reason": "the timing model computes its gradient in closed form",
        "worker_math_device": "cpu"}
    said = [r for r in caplog.records if "one by one" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


@pytest.mark.parametrize("device_type", ["cpu", "mps", "xpu"])
def test_auto_computes_one_by_one_on_every_device_but_cuda(device_type: str) -> None:
    """Only CUDA was measured to pay (docs/gpu.md): auto batches there alone."""
    refusal = auto_refusal(device_type, 512)
    assert refusal == f"a batched call does not pay on {device_type}"


def test_a_named_cuda_device_keeps_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda`` names the current device (here 0); ``cuda:1`` stays cuda:1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert with_index(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert with_index(torch.device("cuda")) == torch.device("cuda", 0)
    assert with_index(torch.device("cpu")) == torch.device("cpu")


def test_the_probe_draws_from_rank_0_which_every_run_has() -> None:
    """A one-worker run asked to batch: the probe's batch must come from rank 0's source
    (a fresh one), or it fails and the run falls back for no reason."""
    spec = RunSpec(name="one", workers=1, clock="virtual", compute=ComputeSpec(batched="on"))

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))

    def batches(rank: int) -> object:
        if rank != 0:
            raise IndexError(f"rank {rank} of a one-worker run")
        return _batches

    chosen = choose_worker_math(spec, model, batches)  # type: ignore[arg-type]
    assert (chosen.path, chosen.fell_back) == ("batched", False)
