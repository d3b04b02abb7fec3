"""Data partitions: how the training set is split across workers (seeded, reproducible).

- ``iid``: a seeded permutation dealt out evenly.
- ``dirichlet``: label skew; for each class, the shares of the workers are drawn from
  Dirichlet(alpha) and that class's samples are split accordingly (small alpha = few
  classes per worker). Every worker is guaranteed at least one sample.
- ``shards``: each worker gets samples of exactly `classes_per_worker` classes; the
  classes are dealt round-robin from a seeded shuffle and each class's samples are split
  evenly among the workers holding it (the FedAvg paper's pathological non-IID split).
  Classes that no worker holds (fewer workers x classes than classes) are not trained on.
"""

from __future__ import annotations

import numpy as np
import torch

PARTITIONS = ("iid", "dirichlet", "shards")


def partition(labels: torch.Tensor, workers: int, kind: str, seed: int, alpha: float = 0.5,
              classes_per_worker: int = 2) -> list[torch.Tensor]:
    """Split sample indices into `workers` disjoint shards (see the module docstring)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    if kind == "iid":
        order = rng.permutation(len(y))
        shards = [order[rank::workers] for rank in range(workers)]
    elif kind == "dirichlet":
        shards = _dirichlet(y, workers, alpha, rng)
    elif kind == "shards":
        shards = _by_class(y, workers, classes_per_worker, rng)
    else:
        raise ValueError(f"unknown partition {kind!r}; known: {', '.join(PARTITIONS)}")
    return [torch.from_numpy(np.sort(s).astype(np.int64)) for s in shards]


def _dirichlet(y: np.ndarray, workers: int, alpha: float,
               rng: np.random.Generator) -> list[np.ndarray]:
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    parts: list[list[int]] = [[] for _ in range(workers)]
    for cls in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == cls))
        shares = rng.dirichlet(np.full(workers, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for rank, piece in enumerate(np.split(members, cuts)):
            parts[rank].extend(piece.tolist())
    for rank in range(workers):  # no empty worker: borrow one sample from the largest
        if not parts[rank]:
            donor = max(range(workers), key=lambda r: len(parts[r]))
            parts[rank].append(parts[donor].pop())
    return [np.asarray(p, dtype=np.int64) for p in parts]


def _by_class(y: np.ndarray, workers: int, per_worker: int,
              rng: np.random.Generator) -> list[np.ndarray]:
    classes = rng.permutation(np.unique(y))
    if not 1 <= per_worker <= len(classes):
        raise ValueError(f"classes_per_worker must be in 1..{len(classes)}, got {per_worker}")
    owned = [[int(classes[(rank * per_worker + i) % len(classes)]) for i in range(per_worker)]
             for rank in range(workers)]
    holders: dict[int, list[int]] = {}
    for rank, mine in enumerate(owned):
        for cls in mine:
            holders.setdefault(cls, []).append(rank)
    parts: list[list[int]] = [[] for _ in range(workers)]
    for cls, ranks in holders.items():
        members = rng.permutation(np.flatnonzero(y == cls))
        for rank, piece in zip(ranks, np.array_split(members, len(ranks)), strict=True):
            parts[rank].extend(piece.tolist())
    return [np.asarray(p, dtype=np.int64) for p in parts]
