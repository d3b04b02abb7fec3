"""Flat parameter vector, flat SGD and the synthetic data."""

from __future__ import annotations

import torch

from asyncsync.hetero.partition import partition
from asyncsync.training.data import BatchSampler, synthetic
from asyncsync.training.models import build_model
from asyncsync.training.optim import FlatSGD
from asyncsync.training.trainer import Trainer
from tests.helpers import batches_of, tiny_data, tiny_model


def test_parameters_are_views_into_one_flat_vector() -> None:
    x, y = tiny_data()
    trainer = Trainer(tiny_model(), batches_of(x, y, 0), device="cpu")
    first = next(trainer.params.module.parameters())
    trainer.flat.zero_()
    assert float(first.detach().abs().sum()) == 0.0
    trainer.flat.fill_(1.0)
    assert bool((first == 1.0).all())
    assert trainer.numel == sum(p.numel() for p in tiny_model().parameters())


def test_flat_gradient_and_sgd_match_torch() -> None:
    x, y = tiny_data()
    reference = tiny_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    trainer = Trainer(tiny_model(), batches_of(x, y, 3), lr=0.1, momentum=0.9,
                      weight_decay=0.01, device="cpu")
    ref_batches = batches_of(x, y, 3)
    for _ in range(3):
        trainer.local_step(16)
        inputs, targets = ref_batches(16)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(inputs), targets).backward()
        ref_opt.step()
    expected = torch.cat([p.detach().flatten() for p in reference.parameters()])
    assert torch.allclose(trainer.flat, expected, atol=1e-6)


def test_flat_sgd_nesterov_and_validation() -> None:
    opt = FlatSGD(0.5, momentum=0.5, nesterov=True)
    w, g = torch.zeros(2), torch.ones(2)
    assert torch.allclose(opt.update(w, g), torch.full((2,), 0.75))  # 0.5 * (1 + 0.5 * 1)
    for kwargs, word in (({"lr": 0}, "lr"), ({"lr": 1, "momentum": 1.0}, "momentum"),
                         ({"lr": 1, "nesterov": True}, "nesterov"),
                         ({"lr": float("nan")}, "lr"), ({"lr": float("inf")}, "lr"),
                         ({"lr": 1, "weight_decay": float("nan")}, "weight_decay"),
                         ({"lr": 1, "weight_decay": float("inf")}, "weight_decay")):
        try:
            FlatSGD(**kwargs)  # type: ignore[arg-type]
        except ValueError as exc:
            assert word in str(exc)
        else:
            raise AssertionError(f"{kwargs} accepted")


def test_synthetic_is_deterministic_and_learnable_shape() -> None:
    a, b = synthetic(seed=1, train_size=200, test_size=50), synthetic(seed=1, train_size=200,
                                                                      test_size=50)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert a.input_shape == (1, 32, 32)
    assert set(a.train_y.tolist()) == set(range(10))
    c = synthetic(seed=2, train_size=200, test_size=50)
    assert not torch.equal(a.train_x, c.train_x)
    model = build_model("cnn", a.input_shape, a.num_classes, {})
    assert model(a.test_x[:4]).shape == (4, 10)


def test_iid_partition_is_disjoint_and_complete() -> None:
    labels = torch.arange(103) % 10
    shards = partition(labels, 4, "iid", seed=0)
    joined = torch.cat(shards)
    assert sorted(joined.tolist()) == list(range(103))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert all(torch.equal(s, t) for s, t in zip(shards, partition(labels, 4, "iid", 0),
                                                  strict=True))


def test_batch_sampler_stays_in_its_shard_and_wraps() -> None:
    data = synthetic(seed=0, train_size=100, test_size=10)
    shard = torch.arange(10)
    sampler = BatchSampler(data, shard, seed=0)
    seen = torch.cat([sampler(7)[1] for _ in range(5)])
    assert len(seen) == 35
    x, _ = sampler(3)
    assert any(torch.equal(x[0], data.train_x[i]) for i in range(10))
