"""Trainers that borrow their local steps' gradient from one `ScratchGradients` step as
trainers that keep their own, to the bit, and hold no gradient between steps."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from asyncsync.training.trainer import FlatModule, ScratchGradients, Trainer


def model() -> nn.Module:
    torch.default_generator.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def source(rank: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(40, 6, generator=gen), torch.randint(3, (40,), generator=gen)
    at = [0]

    def draw(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        begin = at[0] % 32
        at[0] += size
        return x[begin : begin + size], y[begin : begin + size]

    return draw


def bits(vector: torch.Tensor) -> torch.Tensor:
    return vector.detach().clone().view(torch.int32)


def test_borrowed_gradients_step_as_own_ones_and_are_not_kept() -> None:
    template = model()
    plain = [Trainer(copy.deepcopy(template), source(r), lr=0.1, momentum=0.9,
                     weight_decay=0.01, device="cpu") for r in range(2)]
    lent = [Trainer(copy.deepcopy(template), source(r), lr=0.1, momentum=0.9,
                    weight_decay=0.01, device="cpu") for r in range(2)]
    scratch = ScratchGradients()
    for trainer in lent:
        trainer.scratch = scratch
    center = torch.linspace(-1, 1, plain[0].numel)
    for step in range(4):  # the two workers take turns, as in a virtual run
        for a, b in zip(plain, lent, strict=True):
            term: dict[str, Any] = {"center": center, "rho": 0.5} if step % 2 else {}
            assert a.local_step(4, **term) == b.local_step(4, **term)
            assert torch.equal(bits(a.flat), bits(b.flat))
            assert not b.params.holds_grad
    # one vector served both (its views stay on the modules), and none is a worker's own
    assert len(scratch._free[(lent[0].numel, torch.device("cpu"))]) == 1
    shared = scratch._free[(lent[0].numel, torch.device("cpu"))][0]
    for trainer in lent:
        for p in trainer.params.module.parameters():
            assert p.grad is not None
            assert p.grad.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()


def test_a_gradient_after_borrowed_steps_goes_to_the_trainers_own_vector() -> None:
    template = model()
    plain = Trainer(copy.deepcopy(template), source(0), lr=0.1, device="cpu")
    lent = Trainer(copy.deepcopy(template), source(0), lr=0.1, device="cpu")
    lent.scratch = ScratchGradients()
    for _ in range(2):
        plain.local_step(4)
        lent.local_step(4)
    assert plain.gradient(4) == lent.gradient(4)
    own = lent.gradient_vector()
    assert torch.equal(bits(own), bits(plain.gradient_vector()))
    borrowed = lent.scratch.take(lent.numel, lent.device)
    assert own.untyped_storage().data_ptr() != borrowed.untyped_storage().data_ptr()
    assert lent.params.holds_grad  # kept: a gradient push may send it as it is
    before = bits(own)
    lent.local_step(4)  # with its own gradient: nothing borrowed, the vector is reused
    assert lent.params.grad.data_ptr() == own.data_ptr()
    assert not torch.equal(before, bits(own))


def test_a_flat_module_that_never_computes_holds_no_gradient() -> None:
    holder = FlatModule(model(), torch.device("cpu"))  # the server's model, an evaluator
    assert not holder.holds_grad
    assert all(p.grad is None for p in holder.module.parameters())
    grad = holder.grad  # made at its first use, zeros, the parameters' .grad its views
    assert torch.equal(grad, torch.zeros(holder.flat.numel()))
    offset = 0
    for p in holder.module.parameters():
        assert p.grad is not None
        assert p.grad.data_ptr() == grad[offset:].data_ptr()
        offset += p.numel()
