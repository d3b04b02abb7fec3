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
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from asyncsync.training.catalog import (
    DATASETS,
    TORCHVISION,
    DatasetMissing,
    no_empty_folders_left,
)
from asyncsync.training.dataset_files import (
    DatasetFileError,
    read_cifar_batch,
    read_idx_split,
)

NUM_CLASSES = 10
"""The classes of every dataset asyncsync knows (labels outside 0..9 are refused)."""


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
        # in place, on gathered rows: the values of amplitude * p + blend * q, bit for
        # bit, at half the time (no fresh tensor per product)
        images = protos.index_select(0, labels * modes + mode).mul_(amplitude)
        images.add_(protos.index_select(0, other * modes + other_mode).mul_(blend))
        shifts = torch.randint(-max_shift, max_shift + 1, (count, 2), generator=gen)
        for dy in range(-max_shift, max_shift + 1):
            for dx in range(-max_shift, max_shift + 1):
                rows = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().flatten()
                if len(rows):
                    images[rows] = torch.roll(images[rows], shifts=(dy, dx), dims=(2, 3))
        images.add_(torch.randn(images.shape, generator=gen).mul_(noise))
        return images.contiguous(), labels

    train_x, train_y = sample(train_size)
    test_x, test_y = sample(test_size)
    return Dataset(train_x, train_y, test_x, test_y, num_classes)


class BatchSampler:
    """Draws mini-batches from `indices` (a worker's shard) in seeded, reshuffled epochs.

    Called with a batch size it is a `BatchSource` (one that tells its `shard_size`: a
    `asyncsync.training.trainer.ShardBatchSource`). `rows` draws the same batch as row
    indices into `data`'s training split, for a caller that gathers many workers' batches
    at once (`asyncsync.engine.cohort`).
    """

    def __init__(self, data: Dataset, indices: torch.Tensor, seed: int) -> None:
        if len(indices) == 0:
            raise ValueError("a worker's data shard is empty")
        self.data = data
        # Python ints: a batch's rows are a list slice, not three calls into torch (a
        # population's shards are a few samples, so most batches span two epochs)
        self._indices: list[int] = indices.tolist()
        self._gen = torch.Generator().manual_seed(seed)
        self._order = self._shuffled()
        self._cursor = 0

    @property
    def shard_size(self) -> int:
        """The samples in the shard (one epoch)."""
        return len(self._indices)

    def _shuffled(self) -> list[int]:
        indices = self._indices
        return [indices[i] for i in torch.randperm(len(indices), generator=self._gen).tolist()]

    def rows(self, batch_size: int) -> list[int]:
        """The next `batch_size` samples' rows, wrapping into a fresh shuffle at the epoch
        end."""
        end = self._cursor + batch_size
        if end <= len(self._order):
            self._cursor = end
            return self._order[end - batch_size : end]
        picked: list[int] = []
        while len(picked) < batch_size:
            if self._cursor == len(self._order):
                self._order = self._shuffled()
                self._cursor = 0
            take = min(batch_size - len(picked), len(self._order) - self._cursor)
            picked += self._order[self._cursor : self._cursor + take]
            self._cursor += take
        return picked

    def gather(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at `rows`."""
        # index_select, not x[rows]: the same rows at a third of advanced indexing's cost
        at = torch.tensor(rows)
        return self.data.train_x.index_select(0, at), self.data.train_y.index_select(0, at)

    def __call__(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next `batch_size` samples (`rows`, gathered)."""
        return self.gather(self.rows(batch_size))


def load_dataset(name: str, seed: int, root: str | Path = "data",
                 download: bool = False) -> Dataset:
    """Load a dataset by name.

    Args:
        name: ``synthetic`` (built in, made from `seed`), ``mnist``, ``fashion_mnist`` or
            ``cifar10`` (torchvision's on-disk formats under `root`, read and checked by
            `asyncsync.training.dataset_files`, never unpickled).
        seed: seeds the synthetic task.
        root: directory holding torchvision datasets.
        download: let torchvision download missing files (needs internet access).

    Raises:
        DatasetMissing: a file is absent (and was not downloaded).
        DatasetFileError: a file is malformed (the message names it and the problem).
    """
    if name == "synthetic":
        return synthetic(seed=seed)
    if name not in TORCHVISION:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    cls_name, folder, files, mean, std = TORCHVISION[name]
    where = Path(root) / folder
    needed = split_files(name)
    absent = [file for file in (*needed["train"], *needed["test"])
              if not (where / file).is_file()]
    failure = "download off (data.download = false)"
    if absent and download:
        failure = download_files(cls_name, Path(root), where) or "the download gave no files"
        absent = [file for file in absent if not (where / file).is_file()]
    if absent:
        hint = (f"run `asyncsync data {name}` (it installs them offline from a system "
                f"package where there is one, e.g. Debian's dataset-fashion-mnist), set "
                f"data.download = true on a machine with internet access, or copy them there")
        raise DatasetMissing(f"{name}: files not found in {where}: {', '.join(absent)} "
                             f"(expected {files}); {hint} ({failure})")
    try:
        splits = [_read_split(name, where, needed[split]) for split in ("train", "test")]
    except OSError as exc:  # there, but unreadable (permissions, an I/O error)
        raise DatasetFileError(f"{exc.filename or where}: cannot read: "
                               f"{exc.strerror or exc}") from exc
    (train_x, train_y), (test_x, test_y) = (_tensors(images, labels, mean, std)
                                            for images, labels in splits)
    return Dataset(train_x, train_y, test_x, test_y, num_classes=NUM_CLASSES)


def split_files(name: str) -> dict[str, list[str]]:
    """The files of dataset `name`'s train and test splits, as torchvision lays them out."""
    if name == "cifar10":
        return {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    return {split: [f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"]
            for split, prefix in (("train", "train"), ("test", "t10k"))}


def _read_split(name: str, where: Path, files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One split's uint8 images and labels, read and checked from `files` in `where`."""
    if name != "cifar10":
        return read_idx_split(where, files[0].split("-")[0], NUM_CLASSES)
    batches = [read_cifar_batch(where / file, NUM_CLASSES) for file in files]
    return (np.concatenate([images for images, _ in batches]),
            np.concatenate([labels for _, labels in batches]))


def download_files(cls_name: str, root: Path, folder: Path) -> str | None:
    """Let torchvision download dataset class `cls_name`'s files into `root` (its own
    checksums checked), without letting it read them: None, or why it failed (then `folder`,
    where its files go, is not left behind empty)."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, cls_name)
    fetcher = cls.__new__(cls)  # not __init__: it would read the files, CIFAR's by pickle
    fetcher.root = str(root)
    try:
        with no_empty_folders_left(folder):
            fetcher.download()
    # torchvision fails with URLError (no network), RuntimeError (all mirrors failed, bad
    # checksum) or, reading a malformed file already there, AssertionError and others.
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def _tensors(data: np.ndarray, targets: np.ndarray, mean: tuple[float, ...],
             std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, H, W) or (N, H, W, C) to normalized float (N, C, H, W)."""
    images = torch.from_numpy(np.array(data))  # a copy: the file's bytes are read-only
    images = images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2)
    x = images.float().div(255.0)
    x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    return x.contiguous(), torch.from_numpy(targets.astype(np.int64))
