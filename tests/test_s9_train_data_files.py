"""Real datasets as a user brings them: IDX and CIFAR-10 files read, checked, never
unpickled; each bad file is refused with its name and the problem."""

from __future__ import annotations

import pickle
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncsync.training.catalog import DatasetMissing
from asyncsync.training.data import load_dataset
from asyncsync.training.dataset_files import DatasetFileError

RNG = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_folder(root: Path, counts: tuple[int, int] = (20, 8)) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in zip(("train", "t10k"), counts, strict=True):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", RNG.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    return raw


def cut_tail(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


BAD_IDX: dict[str, tuple[str, Callable[[Path], object], str]] = {
    "label out of range": ("train-labels-idx1-ubyte", lambda p: write_idx(
        p, np.arange(20) % 12), "label 11, expected labels 0..9"),
    "truncated images": ("train-images-idx3-ubyte", cut_tail, "(truncated)"),
    "header cut short": ("t10k-labels-idx1-ubyte",
                         lambda p: p.write_bytes(p.read_bytes()[:5]), "shorter than"),
    "fewer labels than images": ("t10k-labels-idx1-ubyte", lambda p: write_idx(
        p, np.arange(5)), "5 labels for 8 images"),
    "images flattened": ("train-images-idx3-ubyte", lambda p: write_idx(
        p, np.zeros((20, 784))), "3 dimension(s)"),
    "empty test split": ("t10k-images-idx3-ubyte", lambda p: write_idx(
        p, np.zeros((0, 28, 28))), "no samples"),
    "images without pixels": ("t10k-images-idx3-ubyte", lambda p: write_idx(
        p, np.zeros((8, 0, 28))), "images of 0x28 pixels"),
    "dimensions whose product wraps at 2**64": ("train-images-idx3-ubyte", lambda p: p.write_bytes(
        bytes([0, 0, 8, 3]) + struct.pack(">III", 2**31, 2**31, 4)), "(truncated)"),
    "trailing bytes": ("train-labels-idx1-ubyte",
                       lambda p: p.write_bytes(p.read_bytes() + b"\0"), "trailing bytes"),
}


@pytest.mark.parametrize("case", sorted(BAD_IDX))
def test_a_bad_idx_file_is_named_with_its_problem(tmp_path: Path, case: str) -> None:
    file, damage, problem = BAD_IDX[case]
    raw = mnist_folder(tmp_path)
    damage(raw / file)
    before = {p.name: p.read_bytes() for p in raw.iterdir()}
    with pytest.raises(DatasetFileError) as err:
        load_dataset("mnist", seed=0, root=tmp_path)
    assert str(err.value).startswith(f"{raw / file}: ")
    assert problem in str(err.value)
    assert {p.name: p.read_bytes() for p in raw.iterdir()} == before  # nothing lost


def test_a_missing_test_split_names_its_files(tmp_path: Path) -> None:
    raw = mnist_folder(tmp_path)
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / name).unlink()
    with pytest.raises(DatasetMissing) as err:
        load_dataset("mnist", seed=0, root=tmp_path)
    assert f"{raw}: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (expected" in str(err.value)


def test_idx_files_read_as_torchvision_reads_them(tmp_path: Path) -> None:
    import torchvision.datasets

    mnist_folder(tmp_path, counts=(30, 10))
    ours = load_dataset("mnist", seed=0, root=tmp_path)
    theirs = torchvision.datasets.MNIST(str(tmp_path), train=False)
    pixels = (ours.test_x * 0.3081 + 0.1307) * 255
    assert torch.equal(pixels.round().to(torch.uint8), theirs.data.unsqueeze(1))
    assert torch.equal(ours.test_y, theirs.targets)


def cifar_folder(root: Path, batch: Callable[[int], Any] | None = None,
                 protocol: int = 4, damaged: str = "data_batch_3") -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        contents: Any = {"data": RNG.integers(0, 256, (4, 3072), dtype=np.uint8),
                         "labels": [1, 2, 3, 9], "batch_label": name}
        if batch is not None and name == damaged:
            contents = batch(4)
        (folder / name).write_bytes(pickle.dumps(contents, protocol=protocol))
    return folder


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_read_as_torchvision_reads_them(
        tmp_path: Path, protocol: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets
    import torchvision.datasets.cifar as cifar

    cifar_folder(tmp_path, protocol=protocol)
    ours = load_dataset("cifar10", seed=0, root=tmp_path)
    # torchvision, reading the same files (it wants the real archive's MD5 sums and meta)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(
        pickle.dumps({"label_names": [str(i) for i in range(10)]}))
    theirs = torchvision.datasets.CIFAR10(str(tmp_path), train=True)
    mean = torch.tensor((0.4914, 0.4822, 0.4465)).view(1, 3, 1, 1)
    std = torch.tensor((0.2470, 0.2435, 0.2616)).view(1, 3, 1, 1)
    pixels = ((ours.train_x * std + mean) * 255).round().to(torch.uint8)
    assert torch.equal(pixels, torch.from_numpy(theirs.data).permute(0, 3, 1, 2))
    assert ours.train_y.tolist() == theirs.targets


def python2_batch(count: int) -> bytes:
    """A batch as CIFAR-10's own files hold it: Python 2's cPickle, protocol 2, byte-string
    keys and pixels, numpy's pre-2.0 module names."""
    def short(text: bytes) -> bytes:
        return pickle.SHORT_BINSTRING + bytes([len(text)]) + text

    pixels = bytes(range(256)) * (count * 3072 // 256)
    dtype = (pickle.GLOBAL + b"numpy\ndtype\n" + short(b"u1") + pickle.NEWFALSE
             + pickle.NEWTRUE + pickle.TUPLE3 + pickle.REDUCE + pickle.MARK
             + pickle.BININT1 + b"\x03" + short(b"|") + pickle.NONE * 3
             + (pickle.BININT + struct.pack("<i", -1)) * 2 + pickle.BININT1 + b"\x00"
             + pickle.TUPLE + pickle.BUILD)
    array = (pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n"
             + pickle.GLOBAL + b"numpy\nndarray\n" + pickle.BININT1 + b"\x00"
             + pickle.TUPLE1 + short(b"b") + pickle.TUPLE3 + pickle.REDUCE + pickle.MARK
             + pickle.BININT1 + b"\x01" + pickle.BININT2 + struct.pack("<H", count)
             + pickle.BININT2 + struct.pack("<H", 3072) + pickle.TUPLE2 + dtype
             + pickle.NEWFALSE + pickle.BINSTRING + struct.pack("<i", len(pixels)) + pixels
             + pickle.TUPLE + pickle.BUILD)
    labels = pickle.EMPTY_LIST + pickle.MARK + b"".join(
        pickle.BININT1 + bytes([i % 10]) for i in range(count)) + pickle.APPENDS
    return (pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + short(b"data")
            + array + short(b"labels") + labels + pickle.SETITEMS + pickle.STOP)


def test_cifar_batches_in_python2_format_are_read(tmp_path: Path) -> None:
    folder = cifar_folder(tmp_path)
    for name in ("data_batch_1", "test_batch"):
        (folder / name).write_bytes(python2_batch(8))
    data = load_dataset("cifar10", seed=0, root=tmp_path)
    assert data.test_x.shape == (8, 3, 32, 32) and data.train_x.shape == (24, 3, 32, 32)
    assert data.test_y.tolist() == list(range(8))
    red = (data.test_x[0, 0] * 0.2470 + 0.4914) * 255  # row 0's first 1024 bytes: red
    assert red.flatten()[:256].round().tolist() == list(range(256))


class Planted:
    """A pickle that, if unpickled by `pickle.load`, creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_cifar_pickle_that_calls_code_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = cifar_folder(tmp_path / "data", lambda n: {"data": Planted(marker),
                                                        "labels": [0] * n})
    with pytest.raises(DatasetFileError) as err:
        load_dataset("cifar10", seed=0, root=tmp_path / "data")
    assert not marker.exists()
    assert str(err.value).startswith(f"{folder / 'data_batch_3'}: not a CIFAR-10 batch")
    assert "open, which a dataset file has no use for; refused" in str(err.value)


BAD_CIFAR: dict[str, tuple[Callable[[int], Any], str]] = {
    "label out of range": (lambda n: {"data": np.zeros((n, 3072), np.uint8),
                                      "labels": [10] * n}, "label 10, expected labels 0..9"),
    "fewer labels": (lambda n: {"data": np.zeros((n, 3072), np.uint8), "labels": [0]},
                     "1 labels for 4 images"),
    "grey images": (lambda n: {"data": np.zeros((n, 1024), np.uint8), "labels": [0] * n},
                    "data of shape (4, 1024), expected (N, 3072)"),
    "float pixels": (lambda n: {"data": np.zeros((n, 3072), np.float32),
                                "labels": [0] * n}, "expected unsigned bytes"),
    "no labels": (lambda n: {"data": np.zeros((n, 3072), np.uint8)}, "no labels"),
    "a list": (lambda n: [np.zeros((n, 3072), np.uint8)], "holds a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_CIFAR))
def test_a_bad_cifar_batch_is_named_with_its_problem(tmp_path: Path, case: str) -> None:
    batch, problem = BAD_CIFAR[case]
    folder = cifar_folder(tmp_path, batch)
    with pytest.raises(DatasetFileError) as err:
        load_dataset("cifar10", seed=0, root=tmp_path)
    assert str(err.value).startswith(f"{folder / 'data_batch_3'}: ")
    assert problem in str(err.value)


def test_a_truncated_cifar_batch_is_named(tmp_path: Path) -> None:
    folder = cifar_folder(tmp_path)
    cut_tail(folder / "test_batch")
    with pytest.raises(DatasetFileError, match=r"test_batch: not a CIFAR-10 batch .*truncated"):
        load_dataset("cifar10", seed=0, root=tmp_path)


@pytest.mark.parametrize("dtype", ["<i8", ">i4", "u1"])
def test_cifar_labels_may_be_an_integer_array(tmp_path: Path, dtype: str) -> None:
    labels = np.array([3, 1, 4, 1], dtype=dtype)
    cifar_folder(tmp_path, lambda n: {"data": np.zeros((n, 3072), np.uint8),
                                      "labels": labels})
    data = load_dataset("cifar10", seed=0, root=tmp_path)
    assert data.train_y[8:12].tolist() == [3, 1, 4, 1]


def test_an_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = mnist_folder(tmp_path)
    refused = raw / "t10k-images-idx3-ubyte"
    original = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == refused:  # as chmod 000 would, also for root
            raise PermissionError(13, "Permission denied", str(path))
        return original(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    expected = re.escape(f"{refused}: cannot read: Permission denied")
    with pytest.raises(DatasetFileError, match=expected):
        load_dataset("mnist", seed=0, root=tmp_path)
