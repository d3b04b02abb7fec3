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


def make_evaluator(model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor) -> Evaluator:
    """An evaluator owning a private copy of `model` that loads each vector it is given."""
    holder = FlatModule(copy.deepcopy(model), torch.device("cpu"))

    def run(vector: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            holder.flat.copy_(vector)
        return evaluate(holder.module, test_x, test_y)

    return run
