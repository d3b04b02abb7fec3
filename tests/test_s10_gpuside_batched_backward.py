"""The batched backward's work grows with the model, not with the model times its number
of parameter tensors.

Each parameter was a view into one leaf of all the rows' parameter columns; autograd then
gave each view's gradient as a zero-filled tensor of all the columns with its slice
copied in, and added them up: resnet18's 62 parameter tensors wrote 62 times its rows
(2 rows of 4 samples on one CPU thread: 8.0 s a call, 7.2 s of it filling zeros; 1.8 s
with a leaf per parameter, the same gradients to the bit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from asyncsync.training.batched import BatchedModel, flat_vector

LAYERS = 16


class Written(TorchDispatchMode):
    """Counts the elements of every new tensor the operations under it produce (a view,
    which writes nothing, is not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.elements += value.numel()
        return out


def deep_mlp() -> nn.Module:
    """16 layers of 32 units: 32 parameter tensors of about 17,000 elements in all."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(16, 32), nn.ReLU()]
    for _ in range(LAYERS - 2):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 3))


def test_a_batched_gradient_writes_a_few_times_its_rows_not_once_per_parameter() -> None:
    model = BatchedModel(deep_mlp(), torch.device("cpu"))
    assert len(model.params) == 2 * LAYERS
    rows = flat_vector(model.template).repeat(4, 1)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 1, 4, 4, generator=gen), torch.randint(3, (2,), generator=gen))
               for _ in range(4)]
    x, y, _ = model.stack(batches)
    written = Written()
    with written:
        grads, _ = model.stacked_gradients(rows, {}, x, y)
    whole = rows.numel()  # the rows' parameter columns (no buffers here)
    assert grads.shape == rows.shape
    # the forward's weights and activations, the backward's gradients and their
    # concatenation: a handful of times the rows, whatever the number of tensors
    assert written.elements < 8 * whole, written.elements / whole
