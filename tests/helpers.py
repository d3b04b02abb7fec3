"""Small models and batch sources shared by the tests."""

from __future__ import annotations

import torch

from asyncsync.trainer import BatchSource


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def tiny_data(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=gen)
    return x, (x[:, 0] > 0).long()


def batches_of(x: torch.Tensor, y: torch.Tensor, seed: int) -> BatchSource:
    gen = torch.Generator().manual_seed(seed)

    def next_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(y), (size,), generator=gen)
        return x[idx], y[idx]

    return next_batch
