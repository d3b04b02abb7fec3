"""Datasets: the built-in synthetic image task, and batch sampling over a worker's shard.

The synthetic task is made from a seed (no download) and is identical in every process:
10 classes, 1x32x32 images. Each class has three smooth prototype patterns ("modes"); a
sample is one of its class's prototypes at a random amplitude and a random translation of up
to 6 pixels, blended with a prototype of another class and buried in Gaussian noise. With a
global batch of 128, the small CNN is near 0.5 test accuracy after 100 SGD steps, 0.8 after
200 and 0.9 after 400 (an MLP lags behind), so on 2 CPU cores accuracy rises over tens of
seconds and protocol differences show up in time-to-accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Dataset:
    """In-memory tensors of a classification task with a held-out test split."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def synthetic(
    seed: int = 0,
    train_size: int = 12000,
    test_size: int = 2000,
    num_classes: int = 10,
    image_size: int = 32,
    noise: float = 1.5,
    max_shift: int = 6,
    modes: int = 3,
    coarse_size: int = 6,
    blend_max: float = 0.6,
) -> Dataset:
    """Build the synthetic task deterministically from `seed` (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes * modes, 1, coarse_size, coarse_size, generator=gen)
    protos = F.interpolate(coarse, size=(image_size, image_size), mode="bicubic",
                           align_corners=False)
    protos = protos / protos.flatten(1).std(dim=1).view(-1, 1, 1, 1)

    def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(num_classes, (count,), generator=gen)
        mode = torch.randint(modes, (count,), generator=gen)
        other = (labels + torch.randint(1, num_classes, (count,), generator=gen)) % num_classes
        other_mode = torch.randint(modes, (count,), generator=gen)
        amplitude = 0.6 + 0.8 * torch.rand(count, 1, 1, 1, generator=gen)
        blend = blend_max * torch.rand(count, 1, 1, 1, generator=gen)
        images = (amplitude * protos[labels * modes + mode]
                  + blend * protos[other * modes + other_mode])
        shifts = torch.randint(-max_shift, max_shift + 1, (count, 2), generator=gen)
        for dy in range(-max_shift, max_shift + 1):
            for dx in range(-max_shift, max_shift + 1):
                rows = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().flatten()
                if len(rows):
                    images[rows] = torch.roll(images[rows], shifts=(dy, dx), dims=(2, 3))
        images += noise * torch.randn(images.shape, generator=gen)
        return images.contiguous(), labels

    train_x, train_y = sample(train_size)
    test_x, test_y = sample(test_size)
    return Dataset(train_x, train_y, test_x, test_y, num_classes)


class BatchSampler:
    """Draws mini-batches from `indices` (a worker's shard) in seeded, reshuffled epochs."""

    def __init__(self, data: Dataset, indices: torch.Tensor, seed: int) -> None:
        if len(indices) == 0:
            raise ValueError("a worker's data shard is empty")
        self._x = data.train_x
        self._y = data.train_y
        self._indices = indices
        self._gen = torch.Generator().manual_seed(seed)
        self._order = self._indices[torch.randperm(len(indices), generator=self._gen)]
        self._cursor = 0

    def next(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next `batch_size` samples, wrapping into a fresh shuffle at the epoch end."""
        picked: list[torch.Tensor] = []
        needed = batch_size
        while needed > 0:
            if self._cursor == len(self._order):
                perm = torch.randperm(len(self._indices), generator=self._gen)
                self._order = self._indices[perm]
                self._cursor = 0
            take = min(needed, len(self._order) - self._cursor)
            picked.append(self._order[self._cursor : self._cursor + take])
            self._cursor += take
            needed -= take
        rows = torch.cat(picked)
        return self._x[rows], self._y[rows]


def load_dataset(name: str, seed: int) -> Dataset:
    """Return a registered dataset; only the built-in `synthetic` task for now."""
    if name != "synthetic":
        raise ValueError(f"unknown dataset {name!r}; known: synthetic")
    return synthetic(seed=seed)
