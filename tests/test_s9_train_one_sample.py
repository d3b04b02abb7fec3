"""A one-sample batch on a model with BatchNorm: PyTorch refuses a training BatchNorm one
value per channel; the step runs its BatchNorm layers on their running statistics instead
(left as they are), one by one and batched alike, and counts its sample."""

from __future__ import annotations

import copy

import torch
from torch import nn

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.hetero.cost_model import count_step_flops
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import Trainer


def bn_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.Linear(6, 3))


def source(seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    return lambda n: (torch.randn(n, 1, 2, 2, generator=gen),
                      torch.randint(3, (n,), generator=gen))


def trainers(count: int) -> list[Trainer]:
    model = bn_mlp()
    return [Trainer(copy.deepcopy(model), source(rank), lr=0.1, momentum=0.9,
                    weight_decay=1e-3, device="cpu") for rank in range(count)]


def test_a_one_sample_step_trains_on_the_running_statistics() -> None:
    trainer = trainers(1)[0]
    trainer.local_step(8)  # running statistics away from their start
    bn = trainer.params.module.get_submodule("2")
    assert isinstance(bn, nn.BatchNorm1d)
    assert bn.running_mean is not None and bn.running_var is not None
    assert bn.num_batches_tracked is not None
    stats = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    before = trainer.flat.clone()
    x, y = source(0)(1)
    trainer.batches = lambda n: (x, y)
    computed = trainer.local_step(1)
    assert computed.samples == 1
    assert not torch.equal(trainer.flat[: trainer.params.num_params],
                           before[: trainer.params.num_params])  # the weights trained
    assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
    assert int(bn.num_batches_tracked) == stats[2]
    assert bn.training  # back in training mode for the next batch
    # the loss is that of the model with BatchNorm on its running statistics
    with torch.no_grad():
        trainer.flat.copy_(before)
        expected = nn.functional.cross_entropy(trainer.params.module.eval()(x), y)
    assert computed.loss == float(expected)


def test_the_batched_path_agrees_on_one_sample_batches() -> None:
    one, batched = trainers(3), trainers(3)
    cohort = Cohort(BatchedModel(bn_mlp(), torch.device("cpu")))
    for size in (4, 1, 4, 1):
        expected = [LocalWork(t, batch_size=size, local=True)() for t in one]
        filed = [cohort.file(LocalWork(t, batch_size=size, local=True)) for t in batched]
        cohort.compute()
        got = [f.work.finish(f.result) for f in filed if f.result is not None]
        for (mine, _), (theirs, _) in zip(expected, got, strict=True):
            assert abs(mine.loss - theirs.loss) < 1e-5
            assert mine.samples == theirs.samples == size
    for first, second in zip(one, batched, strict=True):
        assert torch.allclose(first.flat, second.flat, rtol=0, atol=1e-5)


def test_the_flops_of_a_one_sample_step_are_counted() -> None:
    flops = count_step_flops(bn_mlp(), (1, 2, 2), 1)
    assert flops.flops_per_sample > 0
