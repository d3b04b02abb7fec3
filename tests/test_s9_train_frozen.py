"""A parameter without ``requires_grad`` is left as it is by local steps (as torch's
optimizers skip it), one by one and batched alike."""

from __future__ import annotations

import copy

import torch
from torch import nn

from asyncsync.engine.cohort import Cohort
from asyncsync.engine.work import LocalWork
from asyncsync.training.batched import BatchedModel
from asyncsync.training.trainer import Trainer


def partly_frozen() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    model.get_submodule("1").requires_grad_(False)  # a frozen first layer
    return model


def source(seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    return lambda n: (torch.randn(n, 1, 2, 2, generator=gen),
                      torch.randint(3, (n,), generator=gen))


def trainers(model: nn.Module) -> list[Trainer]:
    return [Trainer(copy.deepcopy(model), source(rank), lr=0.1, momentum=0.9,
                    weight_decay=0.1, device="cpu") for rank in range(2)]


def test_local_steps_leave_frozen_parameters_alone() -> None:
    model = partly_frozen()
    frozen = [p.detach().clone() for p in model.get_submodule("1").parameters()]
    one, batched = trainers(model), trainers(model)
    cohort = Cohort(BatchedModel(model, torch.device("cpu")))
    numel = one[0].numel
    terms = [{}, {"center": torch.ones(numel), "rho": 0.5},
             {"correction": torch.full((numel,), 0.3)}]
    for extra in terms:
        for trainer in one:
            LocalWork(trainer, batch_size=4, local=True, **extra)()  # type: ignore[arg-type]
        filed = [cohort.file(LocalWork(t, batch_size=4, local=True, **extra))  # type: ignore[arg-type]
                 for t in batched]
        cohort.compute()
        for f in filed:
            assert f.result is not None
    for trainer in (*one, *batched):
        layer = trainer.params.module.get_submodule("1")
        for kept, now in zip(frozen, layer.parameters(), strict=True):
            assert torch.equal(kept, now)
        last, start = trainer.params.module.get_submodule("3"), model.get_submodule("3")
        assert isinstance(last, nn.Linear) and isinstance(start, nn.Linear)
        assert not torch.equal(last.weight, start.weight)  # the rest trained
    for first, second in zip(one, batched, strict=True):
        assert torch.allclose(first.flat, second.flat, rtol=0, atol=1e-6)
