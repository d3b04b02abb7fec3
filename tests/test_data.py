"""Partitions' label distributions, torchvision datasets from files on disk, models."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncsync.hetero.partition import partition
from asyncsync.training.catalog import DatasetMissing
from asyncsync.training.data import load_dataset
from asyncsync.training.models import build_model
from asyncsync.training.trainer import FlatModule

LABELS = torch.arange(2000) % 10


def class_counts(shards: list[torch.Tensor]) -> np.ndarray:
    return np.stack([np.bincount(LABELS[s].numpy(), minlength=10) for s in shards])


def check_disjoint_cover(shards: list[torch.Tensor], total: int) -> None:
    joined = torch.cat(shards)
    assert len(joined) == len(set(joined.tolist())) == total


def test_iid_spreads_every_class_evenly() -> None:
    shards = partition(LABELS, 4, "iid", seed=0)
    check_disjoint_cover(shards, 2000)
    counts = class_counts(shards)
    assert counts.min() >= 30 and counts.max() <= 70  # 50 expected per class and worker


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    def skew(alpha: float) -> float:
        counts = class_counts(partition(LABELS, 4, "dirichlet", seed=1, alpha=alpha))
        shares = counts / counts.sum(axis=1, keepdims=True)
        return float(shares.max(axis=1).mean())  # mean share of each worker's top class

    for alpha in (0.05, 100.0):
        check_disjoint_cover(partition(LABELS, 4, "dirichlet", seed=1, alpha=alpha), 2000)
    assert skew(0.05) > 0.5
    assert skew(100.0) < 0.2
    assert torch.equal(torch.cat(partition(LABELS, 4, "dirichlet", 3, 0.3)),
                       torch.cat(partition(LABELS, 4, "dirichlet", 3, 0.3)))


def test_shards_give_each_worker_exactly_k_classes() -> None:
    shards = partition(LABELS, 5, "shards", seed=2, classes_per_worker=2)
    check_disjoint_cover(shards, 2000)
    counts = class_counts(shards)
    assert ((counts > 0).sum(axis=1) == 2).all()
    with pytest.raises(ValueError, match="classes_per_worker"):
        partition(LABELS, 2, "shards", seed=0, classes_per_worker=11)


def write_idx(path: Path, array: np.ndarray) -> None:
    kind = 0x08  # unsigned byte
    header = struct.pack(">BBBB", 0, 0, kind, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize(("name", "folder"), [("mnist", "MNIST"),
                                              ("fashion_mnist", "FashionMNIST")])
def test_mnist_formats_load_through_torchvision(tmp_path: Path, name: str, folder: str) -> None:
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 20), ("t10k", 8)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    data = load_dataset(name, seed=0, root=tmp_path)
    assert data.train_x.shape == (20, 1, 28, 28) and data.test_x.shape == (8, 1, 28, 28)
    assert data.train_y.tolist() == [i % 10 for i in range(20)]
    assert data.train_x.dtype == torch.float32 and abs(float(data.train_x.mean())) < 2
    model = build_model("cnn", data.input_shape, data.num_classes, {})
    assert model(data.test_x).shape == (8, 10)


def test_cifar10_loads_from_batches_in_its_own_format(tmp_path: Path) -> None:
    """Tiny files in CIFAR-10's layout load (no MD5 sum is asked of a run's own files)."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:  # CIFAR-10's own on-disk format is a pickled dict per batch
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                 "labels": [1, 2, 3, 4]}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i)
                                                                        for i in range(10)]}))
    data = load_dataset("cifar10", seed=0, root=tmp_path)
    assert data.train_x.shape == (20, 3, 32, 32) and data.test_x.shape == (4, 3, 32, 32)
    assert data.test_y.tolist() == [1, 2, 3, 4]


def test_missing_files_name_the_expected_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing) as err:
        load_dataset("mnist", seed=0, root=tmp_path / "nowhere")
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "MNIST" / "raw") in message
    assert "train-images-idx3-ubyte" in message and "download" in message


def test_resnet18_for_small_images_and_user_models() -> None:
    model = build_model("resnet18", (3, 32, 32), 10, {})
    flat = FlatModule(model, torch.device("cpu"))
    assert flat.flat.numel() > flat.num_params  # BatchNorm statistics live in the vector
    model.eval()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    custom = build_model("asyncsync.training.models:mlp", (1, 4, 4), 3, {"hidden": 8})
    assert custom(torch.zeros(1, 1, 4, 4)).shape == (1, 3)
    with pytest.raises(ValueError, match="cannot be imported"):
        build_model("no.such.module:thing", (1, 4, 4), 3, {})
    with pytest.raises(ValueError, match="unknown model"):
        build_model("transformer", (1, 4, 4), 3, {})


def test_missing_fashion_mnist_names_the_command_that_installs_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing, match=r"run `asyncsync data fashion_mnist`"):
        load_dataset("fashion_mnist", seed=0, root=tmp_path / "nowhere")


def test_a_failed_download_leaves_no_empty_folder(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision makes ``<root>/FashionMNIST/raw`` before it downloads: a download that
    fails (no network here) leaves none of it; a folder that was there stays."""
    import torchvision.datasets

    def unreachable(self: Any) -> None:
        Path(self.raw_folder).mkdir(parents=True, exist_ok=True)
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no network")

    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "download", unreachable)
    with pytest.raises(DatasetMissing, match="no network"):
        load_dataset("fashion_mnist", seed=0, root=tmp_path / "data", download=True)
    assert not (tmp_path / "data").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(DatasetMissing):
        load_dataset("fashion_mnist", seed=0, root=tmp_path / "kept", download=True)
    assert list((tmp_path / "kept").iterdir()) == []
