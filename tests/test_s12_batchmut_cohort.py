"""Batched worker math where the other cohort tests do not look: frozen parameters under
weight decay and momentum, proximal terms that differ between the workers of one call,
and the chunking of a call by its widest batch. Expected values are hand arithmetic."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training import batched as batched_module
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import ScratchGradients, Trainer
from tests.test_trialb_cohort import _mlp, _source

X = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
Y = torch.tensor([0, 1])
GRADIENT = torch.tensor([[0.5, -0.75], [-0.5, 0.75]])
"""The mean cross-entropy gradient of a zero 2x2 linear map on `X`, `Y`: both logits 0,
so p = (1/2, 1/2) and the gradient is the mean of (p - onehot(y)) x^T:
((-1/2, 1/2) (1, 2) + (1/2, -1/2) (3, -1)) / 2."""


def _fixed(_: int) -> tuple[torch.Tensor, torch.Tensor]:
    return X, Y


def test_a_frozen_later_layer_stays_frozen_under_weight_decay_and_momentum() -> None:
    """Weight decay and momentum make a step of a parameter whose gradient is zero: the
    batched call must leave a frozen parameter as it was, as the one-by-one step does,
    and freeze that parameter's columns, not the first layer's."""
    model = _mlp()
    model[3].weight.requires_grad_(False)
    trainers = [Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=0.9,
                        weight_decay=0.1, device="cpu") for rank in range(2)]
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    first, frozen = model[1].weight.numel() + model[1].bias.numel(), model[3].weight.numel()
    before = [t.flat.clone() for t in trainers]
    for _ in range(2):  # the second step has momentum state
        for trainer in trainers:
            cohort.file(LocalWork(trainer, 4, local=True))
        cohort.compute()
    for trainer, start in zip(trainers, before, strict=True):
        assert torch.equal(trainer.flat[first : first + frozen], start[first : first + frozen])
        moved = trainer.flat[: model[1].weight.numel()] != start[: model[1].weight.numel()]
        assert bool(moved.all())  # weight decay alone moves every trainable weight


def test_workers_of_one_call_keep_their_own_proximal_terms() -> None:
    """A protocol may give each worker its own centre and rho (or none, or a rho of 0):
    one worker's terms must not be applied to another's row. W starts at zero, so the step is
    lr (G + rho (0 - c)) and the new W is -lr (G - rho c)."""
    lr = 0.1
    a, b = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([-2.0, 0.5, 1.0, 0.0])
    centres = [a, b, a, b, None]
    rhos = [0.5, 2.0, 0.0, 0.0, 0.0]  # the last three share a call: two centres, no pull
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    trainers = [Trainer(copy.deepcopy(model), _fixed, lr=lr, device="cpu") for _ in rhos]
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    filed = [cohort.file(LocalWork(t, 2, local=True, center=c, rho=rho))
             for t, c, rho in zip(trainers, centres, rhos, strict=True)]
    cohort.compute()
    for one, trainer, centre, rho in zip(filed, trainers, centres, rhos, strict=True):
        assert one.result is not None and one.result.loss == pytest.approx(math.log(2))
        pull = torch.zeros(4) if centre is None else rho * centre
        expected = -lr * (GRADIENT.flatten() - pull)
        assert torch.allclose(trainer.flat, expected, rtol=0, atol=1e-6), trainer.flat


def test_a_padded_group_is_chunked_by_its_widest_batch(monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    """The mlp's forward holds 16 + 8 + 8 + 3 = 35 activations a sample. With a budget of
    two rows of 16 samples, the batches of 4, 9 and 16 samples take two calls (one row of
    16 more would exceed it), and each step counts its own samples."""
    monkeypatch.setattr(batched_module, "ACTIVATION_BUDGET", 35 * 16 * 2)
    model = _mlp()
    trainers = [Trainer(copy.deepcopy(model), _source(rank), lr=0.1, device="cpu")
                for rank in range(3)]
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    sizes = (4, 9, 16)
    filed = [cohort.file(LocalWork(t, size, local=True))
             for t, size in zip(trainers, sizes, strict=True)]
    cohort.compute()
    assert cohort.calls == 2 and cohort.steps == 3
    assert [f.result.samples if f.result else None for f in filed] == list(sizes)


def test_a_batched_local_step_leaves_a_population_worker_no_gradient_vector() -> None:
    """A population's trainers borrow a gradient for a local step (`ScratchGradients`) and
    hold none between steps, or 1,000 workers would keep 1,000 gradient vectors. A batched
    local step's gradient is never read, so it must not be written into the trainer."""
    model = _mlp()
    scratch = ScratchGradients()
    trainers = [Trainer(copy.deepcopy(model), _source(rank), lr=0.1, device="cpu")
                for rank in range(3)]
    for trainer in trainers:
        trainer.scratch = scratch
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    before = [t.flat.clone() for t in trainers]
    for trainer in trainers:
        cohort.file(LocalWork(trainer, 4, local=True))
    cohort.compute()
    for trainer, start in zip(trainers, before, strict=True):
        assert not torch.equal(trainer.flat, start)  # the step ran
        assert not trainer.params.holds_grad


def test_a_worker_without_momentum_state_shares_a_call_with_workers_that_have_it() -> None:
    """FedAvg's client sampling files a worker's first local step beside workers that have
    stepped before: each keeps its own momentum (a fresh worker's starts at its gradient),
    as one by one."""
    model = _mlp()
    one, batched = ([Trainer(copy.deepcopy(model), _source(rank), lr=0.1, momentum=0.9,
                             device="cpu") for rank in range(3)] for _ in range(2))
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    for sampled in ([0, 1], [0, 1, 2]):  # worker 2 is sampled only in the second round
        for rank in sampled:
            LocalWork(one[rank], 4, local=True)()
            cohort.file(LocalWork(batched[rank], 4, local=True))
        cohort.compute()
    for a, b in zip(one, batched, strict=True):
        assert a.optimizer.momentum_buffer is not None
        assert b.optimizer.momentum_buffer is not None
        assert torch.allclose(a.optimizer.momentum_buffer, b.optimizer.momentum_buffer,
                              rtol=0, atol=1e-5)
        assert torch.allclose(a.flat, b.flat, rtol=0, atol=1e-5)


def test_a_model_built_in_eval_mode_trains_its_batchnorm_as_one_by_one() -> None:
    """A user's model builder may hand back a module in eval mode. A step trains it (the
    one-by-one step puts it in training mode): the batched call must too, so its
    BatchNorm normalizes by the batch and updates its running statistics."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(),
                          nn.Linear(8, 3)).eval()
    one, batched = ([Trainer(copy.deepcopy(model), _source(rank), lr=0.1, device="cpu")
                     for rank in range(2)] for _ in range(2))
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    for trainer in one:
        LocalWork(trainer, 4, local=True)()
    for trainer in batched:
        cohort.file(LocalWork(trainer, 4, local=True))
    cohort.compute()
    for a, b in zip(one, batched, strict=True):
        running_mean = b.params.module[2].running_mean
        assert bool((running_mean != 0).all())  # it started at zeros: training moved it
        assert torch.allclose(a.flat, b.flat, rtol=0, atol=1e-5)
