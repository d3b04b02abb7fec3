"""``asyncsync data NAME``: a real dataset prepared offline from a system package's files."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from asyncsync.schema import ConfigError
from asyncsync.study.prepare import IDX_COUNTS, SYSTEM_PACKAGES, prepare_dataset
from asyncsync.training.catalog import DatasetMissing
from asyncsync.training.data import load_dataset
from tests.test_cli import one_error, run_main

SMALL = {"train": 12, "t10k": 4}
NAMES = [f"{split}-{kind}-idx{rank}-ubyte" for split in ("train", "t10k")
         for kind, rank in (("images", 3), ("labels", 1))]
DEBIAN = SYSTEM_PACKAGES["fashion_mnist"].folder


def idx_bytes(split: str, kind: str, count: int, magic: int | None = None) -> bytes:
    """An IDX file of `count` 28x28 images (image i all grey level i * 10 + 1 for train,
    200 + i for t10k, modulo 256) or labels (i % 10 for train, (9 - i) % 10 for t10k)."""
    if kind == "images":
        base = 1 if split == "train" else 200
        grey = (np.arange(count) * (10 if split == "train" else 1) + base) % 256
        pixels = np.repeat(grey.astype(np.uint8), 28 * 28)
        return struct.pack(">IIII", magic or 2051, count, 28, 28) + pixels.tobytes()
    labels = np.arange(count) % 10 if split == "train" else (9 - np.arange(count)) % 10
    return struct.pack(">II", magic or 2049, count) + labels.astype(np.uint8).tobytes()


def system_dir(folder: Path, counts: dict[str, int], level: int = 6) -> Path:
    """A folder like /usr/share/datasets/fashion-mnist: the four IDX files, gzipped."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        split, kind = name.split("-")[:2]
        (folder / f"{name}.gz").write_bytes(
            gzip.compress(idx_bytes(split, kind, counts[split]), compresslevel=level))
    return folder


def raw_files(root: Path) -> list[str]:
    """Every file under the target folder (temporary ones included)."""
    raw = root / "FashionMNIST" / "raw"
    return sorted(p.name for p in raw.iterdir()) if raw.exists() else []


def test_unpacks_a_system_package_and_load_dataset_reads_it(tmp_path: Path) -> None:
    source = system_dir(tmp_path / "share", SMALL)
    root = tmp_path / "data"
    message = prepare_dataset("fashion_mnist", root, system_dir=source, download=False,
                              counts=SMALL)
    assert message == (f"fashion_mnist: unpacked {source} into {root / 'FashionMNIST/raw'} "
                       f"(12 train, 4 test images)")
    assert raw_files(root) == sorted(NAMES)  # no temporary file left behind
    for name in NAMES:
        unpacked = (root / "FashionMNIST" / "raw" / name).read_bytes()
        assert unpacked == gzip.decompress((source / f"{name}.gz").read_bytes())
    data = load_dataset("fashion_mnist", seed=0, root=root)
    assert data.train_x.shape == (12, 1, 28, 28) and data.test_x.shape == (4, 1, 28, 28)
    assert data.train_y.tolist() == [i % 10 for i in range(12)]
    assert data.test_y.tolist() == [9, 8, 7, 6]
    pixels = data.train_x[:, 0, 0, 0] * 0.3530 + 0.2860  # undo the normalization
    assert np.allclose(pixels.numpy(), (np.arange(12) * 10 + 1) / 255, atol=1e-5)


def test_a_prepared_folder_is_left_as_it_is(tmp_path: Path) -> None:
    source = system_dir(tmp_path / "share", SMALL)
    root = tmp_path / "data"
    prepare_dataset("fashion_mnist", root, system_dir=source, download=False, counts=SMALL)
    raw = root / "FashionMNIST" / "raw"
    before = {name: ((raw / name).read_bytes(), (raw / name).stat().st_mtime_ns)
              for name in NAMES}
    for name in NAMES:  # the source is not even read: it no longer exists
        (source / f"{name}.gz").unlink()
    message = prepare_dataset("fashion_mnist", root, system_dir=source, download=False,
                              counts=SMALL)
    assert message == (f"fashion_mnist: already prepared in {raw} (12 train, 4 test images);"
                       f" nothing to do")
    assert {name: ((raw / name).read_bytes(), (raw / name).stat().st_mtime_ns)
            for name in NAMES} == before


def test_an_invalid_file_in_place_is_replaced_from_the_source(tmp_path: Path) -> None:
    source = system_dir(tmp_path / "share", SMALL)
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / NAMES[0]).write_bytes(idx_bytes("train", "images", 12)[:1000])  # a half file
    message = prepare_dataset("fashion_mnist", tmp_path / "data", system_dir=source,
                              download=False, counts=SMALL)
    assert message.startswith("fashion_mnist: unpacked")
    assert (raw / NAMES[0]).read_bytes() == idx_bytes("train", "images", 12)


@pytest.mark.parametrize(("name", "spoil", "problem"), [
    ("t10k-labels-idx1-ubyte", lambda gz: gz[: len(gz) - 9], "not whole gzip data"),
    ("t10k-labels-idx1-ubyte", lambda gz: b"not gzip" + gz, "not whole gzip data"),
    ("t10k-images-idx3-ubyte",
     lambda gz: gzip.compress(gzip.decompress(gz)[:-28]), "truncated"),
    ("t10k-labels-idx1-ubyte",
     lambda gz: gzip.compress(gzip.decompress(gz) + b"\0"), "trailing bytes"),
    ("t10k-images-idx3-ubyte",
     lambda gz: gzip.compress(idx_bytes("t10k", "images", 4, magic=2049)),
     "magic number 2049, expected 2051"),
    ("train-labels-idx1-ubyte",
     lambda gz: gzip.compress(gzip.decompress(gz)[:-1] + b"\x0a"), "label 10"),
    ("train-labels-idx1-ubyte",
     lambda gz: gzip.compress(idx_bytes("train", "labels", 11)), "11 labels, expected 12"),
    ("train-images-idx3-ubyte",
     lambda gz: gzip.compress(struct.pack(">IIII", 2051, 12, 32, 24) + bytes(12 * 768)),
     "32x24 images, expected 28x28"),
])
def test_a_broken_file_is_refused_and_nothing_is_left(
        tmp_path: Path, name: str, spoil: Callable[[bytes], bytes], problem: str) -> None:
    source = system_dir(tmp_path / "share", SMALL)
    path = source / f"{name}.gz"
    path.write_bytes(spoil(path.read_bytes()))
    with pytest.raises(DatasetMissing) as err:
        prepare_dataset("fashion_mnist", tmp_path / "data", system_dir=source, download=False,
                        counts=SMALL)
    assert str(err.value).startswith(f"{path}: ") and problem in str(err.value)
    assert raw_files(tmp_path / "data") == []  # neither final names nor temporary files


def test_the_real_counts_are_the_default(tmp_path: Path) -> None:
    assert dict(IDX_COUNTS) == {"train": 60_000, "t10k": 10_000}
    source = system_dir(tmp_path / "share", SMALL)
    with pytest.raises(DatasetMissing, match="12 images, expected 60,000"):
        prepare_dataset("fashion_mnist", tmp_path / "data", system_dir=source,
                        download=False)


def test_no_source_says_what_to_install_and_where_to_copy(tmp_path: Path) -> None:
    root, nowhere = tmp_path / "data", tmp_path / "nowhere"
    with pytest.raises(DatasetMissing) as err:
        prepare_dataset("fashion_mnist", root, system_dir=nowhere, download=False)
    message = str(err.value)
    assert "apt install dataset-fashion-mnist" in message
    assert f"into {root / 'FashionMNIST' / 'raw'}" in message
    assert all(name in message for name in NAMES)
    assert f"{nowhere}: no train-images-idx3-ubyte.gz" in message
    assert message.endswith("download: off (--no-download)")


def test_a_split_in_place_without_its_other_files_names_them(tmp_path: Path) -> None:
    """Only the train files in place: the error names the test files that are missing
    (it named only a damaged file, and a run named the missing ones)."""
    root = tmp_path / "data"
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in NAMES[:2]:
        split, kind = name.split("-")[:2]
        (raw / name).write_bytes(idx_bytes(split, kind, SMALL[split]))
    with pytest.raises(DatasetMissing) as err:
        prepare_dataset("fashion_mnist", root, system_dir=tmp_path / "nowhere", download=False,
                        counts=SMALL)
    assert f"{raw}: t10k-images-idx3-ubyte: missing; t10k-labels-idx1-ubyte: missing" in str(
        err.value)


def test_mnist_and_cifar10_have_no_package(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissing) as err:
        prepare_dataset("mnist", tmp_path, download=False)
    assert "apt" not in str(err.value) and str(tmp_path / "MNIST" / "raw") in str(err.value)
    with pytest.raises(DatasetMissing, match="cifar-10-batches-py"):
        prepare_dataset("cifar10", tmp_path, download=False)
    with pytest.raises(ConfigError, match="--from"):
        prepare_dataset("cifar10", tmp_path, system_dir=tmp_path, download=False)


def test_mnist_unpacks_from_a_folder_given(tmp_path: Path) -> None:
    source = system_dir(tmp_path / "share", SMALL)
    message = prepare_dataset("mnist", tmp_path / "data", system_dir=source, download=False,
                              counts=SMALL)
    assert message.startswith("mnist: unpacked")
    assert load_dataset("mnist", seed=0, root=tmp_path / "data").test_y.tolist() == [9, 8, 7, 6]


def test_synthetic_and_unknown_names(tmp_path: Path) -> None:
    assert "nothing to prepare" in prepare_dataset("synthetic", tmp_path)
    with pytest.raises(ConfigError, match="known: synthetic, mnist, fashion_mnist, cifar10"):
        prepare_dataset("imagenet", tmp_path)


def test_cli_prepares_and_refuses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Full-size files (the CLI checks the real counts); each image is one grey level, so
    # they gzip to little.
    source = system_dir(tmp_path / "share", dict(IDX_COUNTS), level=1)
    root = str(tmp_path / "data")
    args = ["data", "fashion_mnist", "--root", root, "--from", str(source), "--no-download"]
    code, out = run_main(capsys, *args)
    assert code == 0, out
    assert " ".join(out.split()) == (f"fashion_mnist: unpacked {source} into {root}/FashionMNIST"
                                     f"/raw (60,000 train, 10,000 test images)")
    code, out = run_main(capsys, *args)
    assert code == 0 and "already prepared" in out
    missing = ["data", "fashion_mnist", "--root", str(tmp_path / "other"), "--from",
               str(tmp_path / "nowhere"), "--no-download"]
    assert "apt install dataset-fashion-mnist" in one_error(run_main(capsys, *missing))
    assert "known:" in one_error(run_main(capsys, "data", "imagenet"))


@pytest.mark.skipif(not (DEBIAN / "train-images-idx3-ubyte.gz").exists(),
                    reason="the Debian package dataset-fashion-mnist is not installed")
def test_the_debian_package_for_real(tmp_path: Path) -> None:
    message = prepare_dataset("fashion_mnist", tmp_path, download=False)
    assert message == (f"fashion_mnist: unpacked {DEBIAN} into {tmp_path / 'FashionMNIST/raw'}"
                       f" (60,000 train, 10,000 test images)")
    data = load_dataset("fashion_mnist", seed=0, root=tmp_path)
    assert data.train_x.shape == (60_000, 1, 28, 28) and data.test_x.shape == (10_000, 1, 28, 28)
    assert sorted(set(data.train_y.tolist())) == list(range(10))
