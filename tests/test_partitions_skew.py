"""Label quantity and quantity skew partitions: sizes and class counts as asked; `check`
shows each worker's shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asyncsync import cli
from asyncsync.hetero.partition import partition

LABELS = torch.arange(10).repeat_interleave(100)  # 10 classes of 100 samples


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_label_quantity_gives_each_worker_exactly_k_classes(k: int) -> None:
    shards = partition(LABELS, 12, "label_quantity", seed=1, classes_per_worker=k)
    held = [set(LABELS[s].tolist()) for s in shards]
    assert all(len(h) == k for h in held)
    assert all(rank % 10 in h for rank, h in enumerate(held))  # class i mod C first
    flat = torch.cat(shards)
    assert len(flat) == len(set(flat.tolist()))  # disjoint
    if 1 < k < 10:
        assert len({frozenset(h) for h in held}) > 1  # the other classes are drawn
    # every class someone holds is split evenly among its holders
    for cls in range(10):
        holders = [len([i for i in s.tolist() if LABELS[i] == cls]) for s in shards]
        counts = [c for c in holders if c]
        assert max(counts) - min(counts) <= 1


def test_label_quantity_refuses_more_classes_than_there_are() -> None:
    with pytest.raises(ValueError, match=r"classes_per_worker must be in 1\.\.10"):
        partition(LABELS, 4, "label_quantity", seed=0, classes_per_worker=11)


def test_quantity_skew_sizes_follow_a_lognormal_of_the_given_sigma() -> None:
    labels = torch.zeros(200_000, dtype=torch.long)
    shards = partition(labels, 2000, "quantity_skew", seed=0, sigma=1.5)
    sizes = np.array([len(s) for s in shards])
    assert sizes.sum() == 200_000 and sizes.min() >= 1
    assert len(set(torch.cat(shards).tolist())) == 200_000  # disjoint, all used
    assert np.log(sizes).std() == pytest.approx(1.5, rel=0.1)
    even = partition(labels[:1000], 10, "quantity_skew", seed=0, sigma=0.0)
    assert [len(s) for s in even] == [100] * 10
    tight = np.array([len(s) for s in partition(labels, 2000, "quantity_skew", seed=0,
                                                sigma=0.2)])
    assert np.log(tight).std() == pytest.approx(0.2, rel=0.1)


def test_quantity_skew_needs_a_sample_per_worker() -> None:
    with pytest.raises(ValueError, match="one each"):
        partition(LABELS[:5], 6, "quantity_skew", seed=0)


RECIPE = """
name = "parts"
[defaults]
workers = {workers}
clock = "virtual"
[defaults.model]
name = "mlp"
[defaults.data]
partition = "label_quantity"
classes_per_worker = 3
[[runs]]
name = "lq"
protocol = "asp"
"""


def test_check_prints_each_workers_shard_and_a_summary_above_32_workers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "parts.toml"
    recipe.write_text(RECIPE.format(workers=4))
    assert cli.main(["check", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "data per worker" in out
    rows = [line.split() for line in out.splitlines()
            if line.split()[:1] in (["lq"], ["0"], ["1"], ["2"], ["3"])
            and "," in line.split()[-1]]
    assert len(rows) == 4 and all(len(row[-1].split(",")) == 3 for row in rows)
    recipe.write_text(RECIPE.format(workers=40))
    assert cli.main(["check", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "40 (min/med/max)" in out and "3 / 3 / 3 classes" in out


def test_a_partition_that_leaves_a_worker_without_a_sample_is_refused_by_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """40 workers over 30 training samples: `check` says that the partition leaves workers
    empty, and which (the run used to fail later with "a worker's data shard is empty")."""
    from asyncsync.study import assembly
    from asyncsync.training.data import Dataset, load_dataset

    full = load_dataset("synthetic", 0, "data", False)
    small = Dataset(full.train_x[:30], full.train_y[:30], full.test_x[:10], full.test_y[:10],
                    full.num_classes)
    monkeypatch.setattr(assembly, "load_dataset", lambda *_: small)
    recipe = tmp_path / "parts.toml"
    recipe.write_text(RECIPE.format(workers=40).replace('"label_quantity"', '"iid"')
                      .replace("classes_per_worker = 3\n", ""))  # (iid reads no such key)
    assert cli.main(["check", str(recipe)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert [line[:7] for line in lines if line.startswith("error:")] == ["error: "]
    out = " ".join(" ".join(lines).split())
    # iid deals the 30 samples round the 40 ranks: ranks 30-39 get none
    assert ("run lq: data.partition: iid leaves 10 of 40 workers without a training "
            "sample (the split has 30; ranks 30, 31, 32, 33, 34, ...)") in out, out
