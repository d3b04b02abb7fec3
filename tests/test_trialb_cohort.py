"""Batched worker math, as a researcher runs it: what a cohort leaves in its workers'
trainers, and the paths' agreement where the other cohort tests do not look."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from torch import nn

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import BatchSource, Trainer


def _source(seed: int) -> BatchSource:
    gen = torch.Generator().manual_seed(seed)

    def batches(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(size, 1, 4, 4, generator=gen), torch.randint(3, (size,),
                                                                       generator=gen)
    return batches


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def test_momentum_state_is_each_workers_own_not_a_view_of_a_calls_rows() -> None:
    """A population samples a few workers a call. Each worker's momentum must hold its own
    vector: a row view of a call's stacked momentum keeps that call's whole stack alive
    for as long as any of its workers is not sampled again."""
    model = _mlp()
    trainers = [Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=0.9,
                        device="cpu") for rank in range(40)]
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    draw = random.Random(0)
    for _ in range(12):
        for trainer in draw.sample(trainers, 5):
            cohort.file(LocalWork(trainer, 4, local=True))
        cohort.compute()
    held = [t.optimizer.momentum_buffer for t in trainers]
    buffers = [b for b in held if b is not None]
    assert len(buffers) > 20
    for buffer in buffers:
        assert buffer.untyped_storage().nbytes() == buffer.numel() * buffer.element_size()


def _bn_mlp(**options: object) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8, **options),
                         nn.ReLU(), nn.Linear(8, 3))


def test_batchnorm_without_running_statistics_batches_and_equals_one_by_one() -> None:
    """Such a BatchNorm normalizes by the batch's statistics in eval mode too: it refuses
    a batch of one sample, and the cohort must not need one."""
    model = _bn_mlp(track_running_stats=False)
    one, batched = ([Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=0.9,
                             device="cpu") for rank in range(3)] for _ in range(2))
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    for _ in range(2):
        expected = [LocalWork(t, 4, local=True)()[0].loss for t in one]
        filed = [cohort.file(LocalWork(t, 4, local=True)) for t in batched]
        cohort.compute()
        assert [f.result.loss if f.result else None for f in filed] == [
            pytest.approx(loss, abs=1e-5) for loss in expected]
    for a, b in zip(one, batched, strict=True):
        assert torch.allclose(a.flat, b.flat, rtol=0, atol=1e-5)


def test_frozen_parameters_stay_frozen_as_one_by_one() -> None:
    """A parameter with ``requires_grad`` off gets no gradient from autograd one by one
    (a fixed projection, a frozen backbone): the batched call must not train it."""
    model = _mlp()
    model[1].weight.requires_grad_(False)
    one, batched = ([Trainer(copy.deepcopy(model), _source(rank), lr=0.1, device="cpu")
                     for rank in range(2)] for _ in range(2))
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    works = [dict(batch_size=4, local=True), dict(batch_size=4)]
    for trainer, work in zip(one, works, strict=True):
        LocalWork(trainer, **work)()  # type: ignore[arg-type]
    for trainer, work in zip(batched, works, strict=True):
        cohort.file(LocalWork(trainer, **work))  # type: ignore[arg-type]
    cohort.compute()
    frozen = model[1].weight.numel()
    for a, b in zip(one, batched, strict=True):
        assert torch.equal(b.flat[:frozen], model[1].weight.detach().flatten())
        assert torch.equal(b.params.grad[:frozen], torch.zeros(frozen))
        assert torch.allclose(a.flat, b.flat, rtol=0, atol=1e-5)


class _Centred(nn.Module):
    """Subtracts the batch's mean sample: it mixes samples without being a BatchNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


def test_unequal_batches_of_a_model_that_mixes_samples_are_not_padded() -> None:
    """A zero sample padded into a batch changes the batch mean such a layer takes: the
    padded row's loss and gradient would be silently wrong (LB-BSP's unequal batches)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), _Centred(), nn.ReLU(),
                          nn.Linear(8, 3))
    one, batched = ([Trainer(copy.deepcopy(model), _source(rank), lr=0.1, device="cpu")
                     for rank in range(3)] for _ in range(2))
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    for _ in range(2):
        sizes = (4, 8, 8)
        expected = [LocalWork(t, size, local=True)()[0].loss
                    for t, size in zip(one, sizes, strict=True)]
        filed = [cohort.file(LocalWork(t, size, local=True))
                 for t, size in zip(batched, sizes, strict=True)]
        cohort.compute()
        assert [f.result.loss if f.result else None for f in filed] == [
            pytest.approx(loss, abs=1e-5) for loss in expected]
    for a, b in zip(one, batched, strict=True):
        assert torch.allclose(a.flat, b.flat, rtol=0, atol=1e-5)
    assert cohort.calls == 4  # a call per batch size


def test_a_calls_stacked_rows_fit_its_budget_for_a_wide_model() -> None:
    """A call stacks its rows' vectors (and their gradients, momentum, steps) beside its
    activations. A model of many parameters and few activations per sample (here 1M
    parameters, 4,019 activations a sample) must be chunked by those too: one call
    stacked 33,395 rows of it, 136 GB."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 1000), nn.ReLU(), nn.Linear(1000, 1000),
                          nn.ReLU(), nn.Linear(1000, 3))
    batched = BatchedModel(model, torch.device("cpu"))
    rows = batched.rows_per_call(4, (1, 4, 4))
    assert rows >= 1 and rows * batched.numel * 4 <= 2**31  # the stacked rows: 2 GiB
