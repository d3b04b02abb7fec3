"""Model registry: `mlp`, `cnn`, `resnet18`, `timing`, or any ``"package.module:callable"``
the user names.

Every builder takes the input shape (C, H, W), the number of classes and keyword options
from the recipe's ``[model]`` table, and returns an ``nn.Module``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from asyncsync.training.catalog import MODELS as MODEL_NAMES

ModelBuilder = Callable[..., nn.Module]


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> nn.Module:
    """Two hidden layers of `hidden` units with ReLU."""
    features = 1
    for size in input_shape:
        features *= size
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def cnn(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Module:
    """Two conv-ReLU-maxpool blocks and two linear layers (no BatchNorm)."""
    channels, height, width_px = input_shape
    flat = 2 * width * (height // 4) * (width_px // 4)
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def resnet18(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 adapted to small images: a 3x3 stride-1 stem, no max-pool."""
    from torchvision.models import resnet18 as tv_resnet18

    model: nn.Module = tv_resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class TimingModel(nn.Module):
    """The stand-in of timing-only runs: one linear unit per class on the mean of the input.

    A step costs the host microseconds whatever model it stands for; the run declares the
    real model's size (the bytes its links charge) and step time (its compute charge). Its
    accuracy means nothing, so timing runs are not evaluated.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        del input_shape  # any input: only its mean is read
        # A linear layer's parameters, initialised as nn.Linear does, held without a child
        # module: a module's bookkeeping is ~2.6 kB, and a run may have 100,000 stand-ins.
        head = nn.Linear(1, num_classes)
        self.weight = head.weight
        self.bias = head.bias

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return F.linear(inputs.flatten(1).mean(1, keepdim=True), self.weight, self.bias)


MODELS: dict[str, ModelBuilder] = dict(zip(MODEL_NAMES, (mlp, cnn, resnet18, TimingModel),
                                            strict=True))


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, options: dict[str, Any]
) -> nn.Module:
    """Build a registered model, or import ``module:callable`` and call it.

    An imported model is checked once per input shape, class count and options: it must
    take a batch of that shape and give one logit per class (`ValueError` otherwise).
    """
    if name in MODELS:
        builder = MODELS[name]
    elif ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            builder = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model {name!r} cannot be imported: {exc}") from exc
    else:
        known = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; known: {known}, or 'package.module:callable'")
    try:
        model = builder(input_shape, num_classes, **options)
    except TypeError as exc:
        raise ValueError(f"model {name!r} rejected its options {options}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r} did not return an nn.Module")
    key = (name, tuple(input_shape), num_classes, repr(sorted(options.items())))
    if name not in MODELS and key not in _FITTING:  # the shipped ones fit by construction
        _check_outputs(name, model, tuple(input_shape), num_classes)
        _FITTING.add(key)
    return model


_FITTING: set[tuple[str, tuple[int, ...], int, str]] = set()
"""The user models (name, input shape, classes, options) already seen to fit their data."""


def _check_outputs(name: str, model: nn.Module, input_shape: tuple[int, ...],
                   num_classes: int) -> None:
    """Refuse a model that cannot take two samples of `input_shape` or does not give one
    logit per class for each (run once, in eval mode, without gradients)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(torch.zeros(2, *input_shape))
    except Exception as exc:  # a user's forward may fail in any way
        raise ValueError(f"model {name!r} cannot take the dataset's inputs of shape "
                         f"{input_shape}: {type(exc).__name__}: {exc}") from None
    finally:
        model.train(was_training)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (2, num_classes):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"model {name!r} gives outputs of shape {got} for 2 samples; the "
                         f"dataset has {num_classes} classes, so (2, {num_classes}) expected")
