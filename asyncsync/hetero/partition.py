"""Data partitions: how the training set is split across workers (seeded, reproducible)."""

from __future__ import annotations

import torch

PARTITIONS = ("iid",)


def partition(labels: torch.Tensor, workers: int, kind: str, seed: int) -> list[torch.Tensor]:
    """Split sample indices into `workers` disjoint shards.

    Args:
        labels: training labels, one per sample.
        workers: number of shards.
        kind: ``"iid"`` deals a seeded random permutation out evenly.
        seed: makes the split reproducible.
    """
    if kind != "iid":
        raise ValueError(f"unknown partition {kind!r}; known: {', '.join(PARTITIONS)}")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=gen)
    return [order[rank::workers] for rank in range(workers)]
