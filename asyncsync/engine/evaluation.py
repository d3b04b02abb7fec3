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


def make_evaluator(model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor,
                   device: torch.device | str = "cpu", samples: int | None = None,
                   batch_size: int = 1000) -> Evaluator:
    """An evaluator owning a private copy of `model` on `device` that loads each vector it
    is given and evaluates it in `eval()` mode, without gradients, `batch_size` samples at a
    time.

    The held-out split (its first `samples`, or all of it) is moved to `device` once, so an
    evaluation on a GPU moves only the model's vector.

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
    inputs, targets = test_x[:samples].to(where), test_y[:samples].to(where)
    try:
        evaluate(holder.module, inputs[:2], targets[:2])
    except (RuntimeError, IndexError, ValueError, TypeError) as exc:
        raise ValueError(f"test_data: its first samples do not fit the model: {exc}") from None

    def run(vector: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            holder.flat.copy_(vector)
        return evaluate(holder.module, inputs, targets, batch_size)

    return run
