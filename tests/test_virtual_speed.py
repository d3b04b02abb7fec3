"""What makes virtual runs cheaper must not change what they compute."""

from __future__ import annotations

import pytest
import torch

from asyncsync.study.simulation import TIMING_CLASSES, StandIn
from asyncsync.training.trainer import Trainer


@pytest.mark.parametrize("batch", [1, 16, 33])
@pytest.mark.parametrize("constant", [True, False])
def test_the_stand_ins_closed_form_gradient_is_autograds(
        batch: int, constant: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit for bit, for the constant batches of timing runs and for any others."""
    backward = torch.autograd.backward
    torch.manual_seed(batch)
    inputs = torch.zeros(batch, 1) if constant else torch.randn(batch, 3)
    targets = torch.randint(0, TIMING_CLASSES, (batch,))
    closed = Trainer(StandIn((1,), TIMING_CLASSES), lambda _: (inputs, targets),
                     device="cpu")
    graph = Trainer(StandIn((1,), TIMING_CLASSES), lambda _: (inputs, targets),
                    device="cpu", loss_fn=lambda out, y: torch.nn.functional.cross_entropy(
                        out, y))  # not the default loss: the closed form is not used
    graph.load(closed.flat * 3 - 0.25)
    closed.load(closed.flat * 3 - 0.25)
    for _ in range(3):
        expected = graph.local_step(batch)
        with monkeypatch.context() as no_autograd:
            no_autograd.setattr(torch.autograd, "backward", None)  # fails if called
            assert closed.local_step(batch) == expected
        assert torch.autograd.backward is backward
        for mine, autograds in ((closed.params.grad, graph.params.grad),
                                (closed.flat, graph.flat)):
            assert torch.equal(mine.view(torch.int32), autograds.view(torch.int32))


def test_stand_ins_that_share_a_memo_compute_a_model_and_batch_once() -> None:
    """A barrier round's workers start from one model: the first computes, the rest look
    the result up, and all of them step as autograd would."""
    memo: dict[bytes, tuple[torch.Tensor, ...]] = {}
    batch = (torch.zeros(16, 1), torch.zeros(16, dtype=torch.long))
    trainers = [Trainer(StandIn((1,), TIMING_CLASSES, memo), lambda _: batch, device="cpu")
                for _ in range(3)]
    reference = Trainer(StandIn((1,), TIMING_CLASSES), lambda _: batch, device="cpu",
                        loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y))
    for trainer in [*trainers[1:], reference]:
        trainer.load(trainers[0].flat)
    results = [trainer.local_step(16) for trainer in [*trainers, reference]]
    assert len(memo) == 1 and len(set(results)) == 1
    for trainer in trainers:
        assert torch.equal(trainer.flat.view(torch.int32), reference.flat.view(torch.int32))
