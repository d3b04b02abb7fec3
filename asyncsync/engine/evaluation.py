"""Evaluation of the global model on a held-out split, and its results."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from asyncsync.training.trainer import FlatModule, evaluate

Evaluator = Callable[[torch.Tensor], tuple[float, float]]
"""Accuracy and loss of a flat vector."""


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation: run time, version, accuracy and loss."""

    t: float
    version: int
    accuracy: float
    loss: float


SUBSET_SEED = 0
"""The seed of the evaluated subset (`evaluated_rows`): fixed, not the run's seed, so every
run of a study, every protocol and repeat, is scored on the same samples."""


def evaluated_rows(total: int, samples: int | None) -> torch.Tensor | None:
    """The rows of a held-out split of `total` samples that an evaluation capped at
    `samples` scores, in ascending order; None for the whole split (uncapped, or a cap of
    at least `total`).

    **(choice)** A uniform random subset without replacement, drawn from a CPU generator
    seeded with `SUBSET_SEED`: the same rows on every host and device and in every run of a
    study, whatever the run's seed and the global random state (which it leaves untouched).
    Not the first `samples` rows: a test file sorted by class (as some are stored) would
    score a few classes only. Random rather than stratified, so it needs nothing of the
    targets; its class counts follow the split's to sampling noise (a hypergeometric
    spread: a standard deviation of 12 samples a class in 2,000 drawn from CIFAR-10's
    10,000).
    """
    if samples is None or samples >= total:
        return None
    draw = torch.Generator().manual_seed(SUBSET_SEED)
    return torch.randperm(total, generator=draw)[:samples].sort().values


def make_evaluator(model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor,
                   device: torch.device | str = "cpu", samples: int | None = None,
                   batch_size: int = 1000) -> Evaluator:
    """An evaluator owning a private copy of `model` on `device` that loads each vector it
    is given and evaluates it in `eval()` mode, without gradients, `batch_size` samples at a
    time.

    The held-out split (all of it, or the fixed subset of `samples` rows that
    `evaluated_rows` picks) is moved to `device` once, so an evaluation on a GPU moves only
    the model's vector.

    Raises:
        ValueError: `samples` or `batch_size` below 1; a split without samples, with
            unequal numbers of inputs and targets, or that the model cannot score (tried
            on two samples).
    """
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be >= 1 (or None for the whole split), got {samples}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    where = torch.device(device)
    holder = FlatModule(copy.deepcopy(model), where)
    if len(test_x) != len(test_y) or not len(test_y):
        raise ValueError(f"test_data: {len(test_x)} inputs but {len(test_y)} targets"
                         if len(test_y) else "test_data: the split has no samples")
    rows = evaluated_rows(len(test_y), samples)
    if rows is not None:
        test_x = test_x.index_select(0, rows.to(test_x.device))
        test_y = test_y.index_select(0, rows.to(test_y.device))
    inputs, targets = test_x.to(where), test_y.to(where)
    try:
        evaluate(holder.module, inputs[:2], targets[:2])
    except (RuntimeError, IndexError, ValueError, TypeError) as exc:
        raise ValueError(f"test_data: its first samples do not fit the model: {exc}") from None

    def run(vector: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            holder.flat.copy_(vector)
        return evaluate(holder.module, inputs, targets, batch_size)

    return run
