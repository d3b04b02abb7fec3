"""`LocalWork`'s refusals of a malformed description (found by mutation testing)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from asyncsync.engine.work import LocalWork
from asyncsync.training.trainer import Trainer

NO_TRAINER = cast(Trainer, object())  # refused before the trainer is used


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_of_no_samples_is_refused(batch_size: int) -> None:
    with pytest.raises(ValueError, match=f"batch_size must be >= 1, got {batch_size}"):
        LocalWork(NO_TRAINER, batch_size)


@pytest.mark.parametrize("term", ["center", "correction"])
def test_a_gradient_with_a_local_steps_term_is_refused(term: str) -> None:
    with pytest.raises(ValueError, match="a gradient takes no proximal or correction"):
        LocalWork(NO_TRAINER, 8, **{term: torch.zeros(2)})  # type: ignore[arg-type]


@pytest.mark.parametrize("copy", [True, False])
def test_a_gradient_is_handed_back_as_a_copy_only_when_asked(copy: bool) -> None:
    # a copy keeps the first gradient when the trainer computes the next one; the
    # trainer's own vector (CPU, copy=False) is overwritten by it
    model = torch.nn.Linear(2, 1, bias=False)
    samples = iter([(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0]])),
                    (torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0]]))])
    trainer = Trainer(model, lambda size: next(samples), lr=0.1,
                      loss_fn=torch.nn.functional.mse_loss, device="cpu")
    with torch.no_grad():
        trainer.flat.zero_()
    # MSE of w.x against 1 at w = 0: gradient 2 (w.x - 1) x = -2 x
    _, first = LocalWork(trainer, 1, copy=copy)()
    assert first is not None and first.tolist() == [-2.0, 0.0]
    _, second = LocalWork(trainer, 1, copy=copy)()
    assert second is not None and second.tolist() == [0.0, -4.0]
    assert first.tolist() == ([-2.0, 0.0] if copy else [0.0, -4.0])
