"""Evaluation of the global model: on the run's device, batched, in eval() mode, capped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asyncsync.engine.core import build_core
from asyncsync.engine.evaluation import evaluated_rows, make_evaluator
from asyncsync.engine.settings import ServerSettings
from asyncsync.study.assembly import server_settings
from asyncsync.study.specs import EvalSpec, RunSpec
from asyncsync.training.trainer import FlatModule


def bn_mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def split(n: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=gen), torch.randint(0, 4, (n,), generator=gen)


def by_hand(model: nn.Module, vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor
            ) -> tuple[float, float]:
    """Accuracy and mean loss computed here, one sample at a time, in eval() mode."""
    holder = FlatModule(model, torch.device("cpu"))
    with torch.no_grad():
        holder.flat.copy_(vector)
        holder.module.eval()
        logits = torch.cat([holder.module(x[i : i + 1]) for i in range(len(y))])
    correct = int((logits.argmax(dim=1) == y).sum())
    return correct / len(y), float(F.cross_entropy(logits, y))


def a_trained_vector() -> torch.Tensor:
    """A vector whose BatchNorm statistics are far from their initial values, so a
    train-mode evaluation (batch statistics) would give other figures."""
    holder = FlatModule(bn_mlp(), torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        holder.flat.add_(torch.randn(holder.flat.shape, generator=gen))
        bn = holder.module[1]
        bn.running_mean.fill_(2.0)
        bn.running_var.fill_(9.0)
    return holder.flat.clone()


def capped(x: torch.Tensor, y: torch.Tensor, samples: int | None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples an evaluation capped at `samples` scores (`evaluated_rows`' subset)."""
    rows = evaluated_rows(len(y), samples)
    return (x, y) if rows is None else (x[rows], y[rows])


@pytest.mark.parametrize(("samples", "batch_size"), [(None, 7), (20, 1000), (13, 4)])
def test_the_evaluator_scores_its_samples_in_eval_mode(samples: int | None,
                                                       batch_size: int) -> None:
    x, y = split()
    vector = a_trained_vector()
    evaluate = make_evaluator(bn_mlp(), x, y, "cpu", samples, batch_size)
    accuracy, loss = evaluate(vector)
    want_accuracy, want_loss = by_hand(bn_mlp(), vector, *capped(x, y, samples))
    assert accuracy == want_accuracy
    assert loss == pytest.approx(want_loss, rel=1e-5)


def test_evaluation_leaves_no_gradient_and_moves_the_split_once() -> None:
    x, y = split()
    evaluate = make_evaluator(bn_mlp(), x, y, "cpu", samples=10)
    before = x.clone()
    evaluate(a_trained_vector())
    assert torch.equal(x, before)  # the caller's split is not touched


@pytest.mark.parametrize("bad", [{"samples": 0}, {"batch_size": 0}])
def test_bad_evaluation_settings_are_refused(bad: dict[str, int]) -> None:
    x, y = split()
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_evaluator(bn_mlp(), x, y, "cpu", **bad)


def test_the_recipe_caps_the_evaluated_samples_of_the_server() -> None:
    """eval.samples and eval.batch_size reach the server's evaluator; the device is the
    run's."""
    spec = RunSpec(eval=EvalSpec(samples=20, batch_size=8))
    settings = server_settings(spec, "run", None)
    assert (settings.eval_samples, settings.eval_batch, settings.eval_device) == (20, 8, "cpu")
    x, y = split()
    core = build_core(bn_mlp(), "asp", 1, settings, test_data=(x, y))
    vector = a_trained_vector()
    evaluator = core.run.evaluator
    assert evaluator is not None
    assert evaluator(vector)[0] == by_hand(bn_mlp(), vector, *capped(x, y, 20))[0]


def test_the_default_evaluates_the_whole_split_on_the_cpu() -> None:
    settings = ServerSettings()
    assert (settings.eval_samples, settings.eval_device) == (None, "cpu")


@pytest.mark.parametrize(("data", "message"), [
    ((torch.randn(10, 5), torch.zeros(10, dtype=torch.long)), "do not fit the model"),
    ((torch.randn(10, 6), torch.zeros(7, dtype=torch.long)), "10 inputs but 7 targets"),
    ((torch.randn(0, 6), torch.zeros(0, dtype=torch.long)), "no samples"),
    ((torch.randn(10, 6), torch.full((10,), 9)), "do not fit the model"),
])
def test_test_data_that_cannot_be_evaluated_is_refused_when_the_server_is_made(
    data: tuple[torch.Tensor, torch.Tensor], message: str,
) -> None:
    """It used to be taken, and every evaluation then failed in a background task without
    a word: no accuracy, no stop record."""
    with pytest.raises(ValueError, match=f"test_data: .*{message}"):
        build_core(bn_mlp(), "asp", 1, ServerSettings(), test_data=data)
