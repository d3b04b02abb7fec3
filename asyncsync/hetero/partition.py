"""Data partitions: how the training set is split across workers (seeded, reproducible).

- ``iid``: a seeded permutation dealt out evenly.
- ``dirichlet``: label skew; for each class, the shares of the workers are drawn from
  Dirichlet(alpha) and that class's samples are split accordingly (small alpha = few
  classes per worker). A worker the draw leaves empty takes one sample from the largest
  shard, so with at least as many samples as workers none is empty.
- ``shards``: each worker gets samples of exactly `classes_per_worker` classes; the
  classes are dealt round-robin from a seeded shuffle and each class's samples are split
  evenly among the workers holding it (after the FedAvg paper's pathological non-IID
  split, which deals sorted shards, so that a client may draw one class twice).
  Classes that no worker holds (fewer workers x classes than classes) are not trained on.
- ``label_quantity``: label quantity skew (Q. Li, Y. Diao, Q. Chen, B. He, "Federated
  Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022, "#C = k"): worker i
  holds class ``i mod C`` and `classes_per_worker` - 1 other classes drawn at random, and
  each class's samples are split evenly among the workers holding it. Classes that no
  worker draws (with fewer workers than classes) are not trained on.
- ``quantity_skew``: iid labels, shard sizes in proportion to draws from a lognormal of
  mean 0 and `sigma` in log space (at least one sample each; sigma 0: equal sizes).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np
import torch

from asyncsync.errors import InputError

PARTITIONS = ("iid", "dirichlet", "shards", "label_quantity", "quantity_skew")
PARTITION_KEYS: dict[str, tuple[str, ...]] = {
    "iid": (), "dirichlet": ("alpha",), "shards": ("classes_per_worker",),
    "label_quantity": ("classes_per_worker",), "quantity_skew": ("sigma",)}
"""The ``data`` keys each partition reads (the others' keys it ignores)."""


def unused_keys(kind: str, keys: Iterable[str]) -> list[str]:
    """The partition keys among `keys` (a recipe's ``data`` keys) that partition `kind`
    does not read: a recipe check refuses them where the run itself sets them."""
    read = PARTITION_KEYS.get(kind, ())
    every = {key for used in PARTITION_KEYS.values() for key in used}
    return [key for key in keys if key in every and key not in read]


class PartitionError(InputError, ValueError):
    """Keys the data cannot be split by; the message names the recipe's key (``data.*``),
    so the command line reports it as one ``error:`` line."""


def partition(labels: torch.Tensor, workers: int, kind: str, seed: int, alpha: float = 0.5,
              classes_per_worker: int = 2, sigma: float = 1.0) -> list[torch.Tensor]:
    """Split sample indices into `workers` disjoint shards (see the module docstring)."""
    if workers < 1:
        raise PartitionError(f"workers must be >= 1, got {workers}")
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    if kind == "iid":
        order = rng.permutation(len(y))
        shards = [order[rank::workers] for rank in range(workers)]
    elif kind == "dirichlet":
        shards = _dirichlet(y, workers, alpha, rng)
    elif kind == "shards":
        shards = _by_class(y, workers, classes_per_worker, rng)
    elif kind == "label_quantity":
        shards = _label_quantity(y, workers, classes_per_worker, rng)
    elif kind == "quantity_skew":
        shards = _quantity_skew(len(y), workers, sigma, rng)
    else:
        raise PartitionError(f"data.partition: unknown partition {kind!r}; known: "
                             f"{', '.join(PARTITIONS)}")
    return [torch.from_numpy(np.sort(s).astype(np.int64)) for s in shards]


def _dirichlet(y: np.ndarray, workers: int, alpha: float,
               rng: np.random.Generator) -> list[np.ndarray]:
    if not 0 < alpha < math.inf:
        raise PartitionError(f"data.alpha must be > 0 and finite, got {alpha}")
    parts: list[list[int]] = [[] for _ in range(workers)]
    for cls in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == cls))
        shares = rng.dirichlet(np.full(workers, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for rank, piece in enumerate(np.split(members, cuts)):
            parts[rank].extend(piece.tolist())
    # no empty worker: each borrows one sample from the largest shard (the lowest rank of
    # the largest ones), in rank order; a heap keeps this O(W log W) for huge populations
    largest = [(-len(part), rank) for rank, part in enumerate(parts)]
    heapq.heapify(largest)
    for rank in range(workers):
        if not parts[rank]:
            _, donor = heapq.heappop(largest)
            parts[rank].append(parts[donor].pop())
            heapq.heappush(largest, (-len(parts[donor]), donor))
            heapq.heappush(largest, (-1, rank))
    return [np.asarray(p, dtype=np.int64) for p in parts]


def _split_classes(y: np.ndarray, owned: list[list[int]], rng: np.random.Generator,
                   ) -> list[np.ndarray]:
    """Each class's samples split evenly among the workers owning it (`owned` per rank)."""
    holders: dict[int, list[int]] = {}
    for rank, mine in enumerate(owned):
        for cls in mine:
            holders.setdefault(cls, []).append(rank)
    parts: list[list[int]] = [[] for _ in owned]
    for cls, ranks in holders.items():
        members = rng.permutation(np.flatnonzero(y == cls))
        for rank, piece in zip(ranks, np.array_split(members, len(ranks)), strict=True):
            parts[rank].extend(piece.tolist())
    return [np.asarray(p, dtype=np.int64) for p in parts]


def _label_quantity(y: np.ndarray, workers: int, per_worker: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    if not 1 <= per_worker <= len(classes):
        raise PartitionError(f"data.classes_per_worker must be in 1..{len(classes)} (the "
                             f"data have {len(classes)} classes), got {per_worker}")
    owned = []
    for rank in range(workers):
        own = int(classes[rank % len(classes)])
        others = [int(c) for c in classes if c != own]
        owned.append([own, *(int(c) for c in rng.choice(others, per_worker - 1,
                                                        replace=False))])
    return _split_classes(y, owned, rng)


def _quantity_skew(samples: int, workers: int, sigma: float,
                   rng: np.random.Generator) -> list[np.ndarray]:
    if not 0 <= sigma < math.inf:
        raise PartitionError(f"data.sigma must be >= 0 and finite, got {sigma}")
    if samples < workers:
        raise PartitionError(f"data.partition: quantity_skew: {samples} samples cannot give "
                             f"{workers} workers one each")
    logs = rng.normal(0.0, sigma, workers)  # lognormal draws, kept in log space: a large
    shares = np.exp(logs - logs.max())      # sigma would overflow them to inf (then NaN)
    sizes = 1 + np.floor(shares / shares.sum() * (samples - workers)).astype(np.int64)
    sizes[: samples - int(sizes.sum())] += 1  # the rounding's remainder, one each
    order = rng.permutation(samples)
    return np.split(order, np.cumsum(sizes)[:-1])


def _by_class(y: np.ndarray, workers: int, per_worker: int,
              rng: np.random.Generator) -> list[np.ndarray]:
    classes = rng.permutation(np.unique(y))
    if not 1 <= per_worker <= len(classes):
        raise PartitionError(f"data.classes_per_worker must be in 1..{len(classes)} (the "
                             f"data have {len(classes)} classes), got {per_worker}")
    owned = [[int(classes[(rank * per_worker + i) % len(classes)]) for i in range(per_worker)]
             for rank in range(workers)]
    return _split_classes(y, owned, rng)
