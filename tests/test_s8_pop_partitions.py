"""Partition keys at their extremes: each split is a disjoint cover of the samples, or one
error naming the recipe key (never a NaN split or a traceback)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from asyncsync import cli
from asyncsync.hetero.partition import PartitionError, partition
from asyncsync.training.data import Dataset

LABELS = torch.arange(200) % 10


def _is_a_cover(shards: list[torch.Tensor], samples: int) -> bool:
    """Whether `shards` hold every sample index exactly once, none empty."""
    joined = torch.cat(shards)
    return (all(len(shard) > 0 for shard in shards) and len(joined) == samples
            and sorted(joined.tolist()) == list(range(samples)))


@pytest.mark.parametrize("alpha", [math.inf, math.nan, 0.0, -1.0])
def test_an_alpha_that_is_not_a_finite_positive_number_is_refused_naming_the_key(
        alpha: float) -> None:
    """An infinite or NaN alpha drew NaN shares: a split of arbitrary sizes, silently."""
    with pytest.raises(PartitionError, match=r"^data\.alpha must be > 0 and finite"):
        partition(LABELS, 5, "dirichlet", seed=0, alpha=alpha)


@pytest.mark.parametrize("sigma", [math.inf, math.nan, -0.5])
def test_a_sigma_that_is_not_a_finite_non_negative_number_is_refused_naming_the_key(
        sigma: float) -> None:
    """A NaN sigma gave workers the same samples twice (and some none)."""
    with pytest.raises(PartitionError, match=r"^data\.sigma must be >= 0 and finite"):
        partition(LABELS, 5, "quantity_skew", seed=0, sigma=sigma)


@pytest.mark.parametrize("sigma", [400.0, 1e300])
def test_a_huge_sigma_still_splits_every_sample_once(sigma: float) -> None:
    """Lognormal draws of such a sigma overflow to inf, and their shares were NaN."""
    shards = partition(LABELS, 7, "quantity_skew", seed=3, sigma=sigma)
    assert _is_a_cover(shards, len(LABELS))
    assert max(len(shard) for shard in shards) == len(LABELS) - 6  # one takes (nearly) all


@pytest.mark.parametrize("alpha", [1e-300, 1e9])
def test_dirichlet_at_the_extremes_of_alpha_is_a_cover(alpha: float) -> None:
    assert _is_a_cover(partition(LABELS, 25, "dirichlet", seed=1, alpha=alpha), len(LABELS))


def test_dirichlet_gives_an_empty_worker_a_sample_of_the_largest_shard() -> None:
    """Tiny alpha leaves all of a class with one worker: the 20 others each borrow one
    sample, from the largest shard at the time (the lowest rank among equals)."""
    labels = torch.zeros(30, dtype=torch.int64)  # one class: one worker gets all of it
    shards = partition(labels, 21, "dirichlet", seed=0, alpha=1e-9)
    assert sorted(len(shard) for shard in shards) == [1] * 20 + [10]


RECIPE = """
name = "parts"
[defaults]
workers = 4
clock = "virtual"
[defaults.model]
name = "mlp"
[defaults.data]
partition = "{partition}"
{key} = {value}
[[runs]]
name = "lq"
protocol = "asp"
"""


@pytest.mark.parametrize(("partition_kind", "key", "value", "expected"), [
    ("shards", "classes_per_worker", "11",
     "data.classes_per_worker must be in 1..10 (the data have 10 classes), got 11"),
    ("label_quantity", "classes_per_worker", "12",
     "data.classes_per_worker must be in 1..10 (the data have 10 classes), got 12"),
])
def test_check_refuses_a_partition_the_data_cannot_take_in_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        partition_kind: str, key: str, value: str, expected: str) -> None:
    """More classes per worker than the data have was a ValueError traceback."""
    from asyncsync.study import assembly

    tiny = Dataset(torch.randn(40, 1, 4, 4), torch.arange(40) % 10, torch.randn(10, 1, 4, 4),
                   torch.arange(10), 10)
    monkeypatch.setattr(assembly, "load_dataset", lambda *_: tiny)
    recipe = tmp_path / "parts.toml"
    recipe.write_text(RECIPE.format(partition=partition_kind, key=key, value=value))
    assert cli.main(["check", str(recipe)]) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in " ".join(lines)
    assert expected in " ".join(" ".join(lines).split())
