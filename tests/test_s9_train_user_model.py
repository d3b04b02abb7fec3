"""A user's model that does not fit the dataset is refused when it is built, by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asyncsync.training.models import build_model


def five_logits(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    del num_classes  # ignores the dataset's class count
    features = input_shape[0] * input_shape[1] * input_shape[2]
    return nn.Sequential(nn.Flatten(), nn.Linear(features, 5))


def fixed_input(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    del input_shape  # assumes CIFAR-sized inputs
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))


def batch_norm_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[1] * input_shape[2], 8),
                         nn.BatchNorm1d(8), nn.Linear(8, num_classes))


def test_a_model_with_the_wrong_class_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"gives outputs of shape \(2, 5\) for 2 samples; "
                                         r"the dataset has 10 classes"):
        build_model(f"{__name__}:five_logits", (1, 28, 28), 10, {})
    assert build_model(f"{__name__}:five_logits", (1, 28, 28), 5, {}) is not None


def test_a_model_that_cannot_take_the_inputs_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cannot take the dataset's inputs of shape "
                                         r"\(1, 28, 28\): RuntimeError"):
        build_model(f"{__name__}:fixed_input", (1, 28, 28), 10, {})


def test_the_check_leaves_the_model_in_training_mode_and_its_statistics_alone() -> None:
    model = build_model(f"{__name__}:batch_norm_mlp", (1, 4, 4), 3, {})
    norm = model.get_submodule("2")
    assert isinstance(norm, nn.BatchNorm1d) and model.training
    assert norm.running_mean is not None and torch.equal(norm.running_mean, torch.zeros(8))
    assert int(norm.num_batches_tracked or 0) == 0
