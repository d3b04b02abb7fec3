"""Partitions' label counts and sizes against hand arithmetic (session 13 mutation tests).

Each test kills a plausible bug the other tests let through: iid shards that drop the
remainder, quantity skew that does not shuffle or gives the rounding's remainder to one
worker, shards not dealt round-robin or always from the same classes, a class split into
runs of consecutive samples, and too few samples for quantity skew let through.
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.hetero.partition import PartitionError, partition

SORTED = torch.arange(10).repeat_interleave(600)
"""10 classes of 600 samples, sorted by class as many datasets' files are."""


def classes_held(shards: list[torch.Tensor]) -> list[set[int]]:
    return [set(SORTED[shard].tolist()) for shard in shards]


def test_iid_deals_every_sample_sizes_differ_by_one_at_most() -> None:
    """10 samples to 3 workers: 4, 3 and 3, every sample once."""
    shards = partition(torch.zeros(10, dtype=torch.int64), 3, "iid", seed=0)
    assert [len(s) for s in shards] == [4, 3, 3]
    assert sorted(torch.cat(shards).tolist()) == list(range(10))


def test_quantity_skew_sigma_0_is_equal_up_to_one_sample() -> None:
    """10 samples, 4 workers, sigma 0: 1 + floor(6 / 4) = 2 each, the 2 left over one
    each to the first ranks: 3, 3, 2, 2."""
    shards = partition(torch.zeros(10, dtype=torch.int64), 4, "quantity_skew", 0, sigma=0.0)
    assert [len(s) for s in shards] == [3, 3, 2, 2]


def test_quantity_skew_keeps_labels_iid_on_sorted_data() -> None:
    """Sigma 0 on 6,000 samples sorted by class: 600 each, and every worker sees every
    class (a class is missing from 600 iid draws with chance 0.9^600, about 1e-27)."""
    shards = partition(SORTED, 10, "quantity_skew", seed=0, sigma=0.0)
    assert [len(s) for s in shards] == [600] * 10
    assert all(held == set(range(10)) for held in classes_held(shards))


@pytest.mark.parametrize("samples", [5, 6])
def test_quantity_skew_needs_one_sample_per_worker_exactly(samples: int) -> None:
    labels = torch.zeros(samples, dtype=torch.int64)
    if samples < 6:
        with pytest.raises(PartitionError, match="5 samples cannot give 6 workers one each"):
            partition(labels, 6, "quantity_skew", seed=0)
    else:
        assert [len(s) for s in partition(labels, 6, "quantity_skew", seed=0)] == [1] * 6


@pytest.mark.parametrize(("workers", "per_worker", "holders"), [(5, 2, 1), (10, 3, 3)])
def test_shards_deal_classes_round_robin(workers: int, per_worker: int,
                                         holders: int) -> None:
    """Dealt round-robin, every class goes to workers x k / C workers (1 for 5 x 2, 3 for
    10 x 3), and those split its 600 samples evenly."""
    shards = partition(SORTED, workers, "shards", seed=4, classes_per_worker=per_worker)
    held = classes_held(shards)
    assert all(len(h) == per_worker for h in held)
    for cls in range(10):
        counts = [int((SORTED[s] == cls).sum()) for s in shards if cls in SORTED[s]]
        assert len(counts) == holders
        assert max(counts) - min(counts) <= 1 and sum(counts) == 600


def test_shards_draw_the_classes_by_the_seed() -> None:
    firsts = {frozenset(classes_held(partition(SORTED, 5, "shards", seed,
                                               classes_per_worker=2))[0])
              for seed in range(10)}
    assert len(firsts) > 1


def test_dirichlet_splits_a_class_at_random_not_in_runs() -> None:
    """Alpha 100 gives each of 4 workers about 150 of a class's 600 samples: drawn at
    random from the class, not a run of consecutive ones."""
    shards = partition(SORTED, 4, "dirichlet", seed=0, alpha=100.0)
    for shard in shards:
        for cls in range(10):
            mine = shard[SORTED[shard] == cls]
            assert len(mine) > 50
            assert int(mine.max() - mine.min()) + 1 > len(mine)  # gaps: not one run


def test_dirichlet_borrows_from_the_largest_shard_as_it_shrinks() -> None:
    """Alpha 1e-9 gives each class whole to one worker: classes of 11 and 10 samples over
    5 workers. Held by two workers, the 3 left empty borrow from the largest at each
    borrow: 11 -> 10, then one 10 -> 9, then the other: 9 and 9. Held by one, 21 -> 17."""
    labels = torch.tensor([0] * 11 + [1] * 10)
    apart = 0
    for seed in range(8):
        sizes = sorted(len(s) for s in partition(labels, 5, "dirichlet", seed, alpha=1e-9))
        apart += sizes != [1, 1, 1, 1, 17]
        assert sizes in ([1, 1, 1, 9, 9], [1, 1, 1, 1, 17]), (seed, sizes)
    assert apart  # (each seed parts them with chance 4/5)
