"""Prepare a real dataset on disk (``asyncsync data NAME``), offline first.

Sources, in this order:

1. the files already under root, if they are valid: nothing is done, so a prepared folder
   is never rewritten;
2. a system package's gzipped IDX files (Debian's ``dataset-fashion-mnist`` installs the real
   Fashion-MNIST in /usr/share/datasets/fashion-mnist), or a folder given as ``--from DIR``:
   they are local, so this works on machines without internet access, and it is fast;
3. torchvision's own download, last because it is the one source that needs the network.

When none works, `DatasetMissing` says what to install, where to copy the files by hand and
why the download failed. A local source with all four files, one of them broken, is
refused with that file named rather than passed over for the download.

Unpacked files are written under a temporary name in the target folder and renamed into
place only once all of them are complete and valid, so an interrupted or refused run leaves
nothing half-written under a name torchvision reads.

IDX files are checked by structure, not by checksum (Debian recompressed the .gz files, so
their MD5 sums differ from torchvision's): big-endian header, magic number, count, 28x28
images, file size equal to header plus payload, labels below 10.
"""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NamedTuple

from asyncsync.schema import ConfigError
from asyncsync.training.catalog import (
    DATASETS,
    TORCHVISION,
    DatasetMissing,
)

Kind = Literal["images", "labels"]

# Images and labels per split of the real MNIST and Fashion-MNIST (tests pass small ones).
IDX_COUNTS: Mapping[str, int] = MappingProxyType({"train": 60_000, "t10k": 10_000})
SPLITS = ("train", "t10k")
KINDS: tuple[Kind, ...] = ("images", "labels")
MAGIC: Mapping[Kind, int] = MappingProxyType({"images": 2051, "labels": 2049})
SIDE = 28  # rows and columns of an MNIST image
NUM_CLASSES = 10
CIFAR10_SIZES = "50,000 train, 10,000 test images"
MISSING = "missing"


class SystemPackage(NamedTuple):
    """A distribution package that installs a dataset's gzipped IDX files."""

    name: str
    folder: Path


SYSTEM_PACKAGES = {
    "fashion_mnist": SystemPackage("dataset-fashion-mnist",
                                   Path("/usr/share/datasets/fashion-mnist")),
}


def idx_name(split: str, kind: Kind) -> str:
    """The file name torchvision reads, e.g. ``train-images-idx3-ubyte``."""
    return f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"


def idx_problem(path: Path, kind: Kind, count: int) -> str | None:
    """What is wrong with the IDX file at `path`, or None if it is whole and valid.

    Args:
        path: the (uncompressed) file.
        kind: ``images`` (magic 2051, count x 28 x 28 bytes) or ``labels`` (magic 2049,
            count bytes, each below 10).
        count: the number of images or labels the file must hold.
    """
    header = 16 if kind == "images" else 8
    try:
        with path.open("rb") as file:
            head = file.read(header)
            if len(head) < header:
                return f"{len(head)} bytes, shorter than the {header}-byte IDX header"
            magic, found, *dims = struct.unpack(f">{header // 4}I", head)
            if magic != MAGIC[kind]:
                return f"magic number {magic}, expected {MAGIC[kind]} (IDX {kind})"
            if found != count:
                return f"{found:,} {kind}, expected {count:,}"
            if dims and dims != [SIDE, SIDE]:
                return f"{dims[0]}x{dims[1]} images, expected {SIDE}x{SIDE}"
            size = os.fstat(file.fileno()).st_size
            expected = header + count * (SIDE * SIDE if kind == "images" else 1)
            if size != expected:
                cut = "truncated" if size < expected else "trailing bytes"
                return f"{size:,} bytes, expected {expected:,} ({cut})"
            if kind == "labels" and (top := max(file.read(), default=0)) >= NUM_CLASSES:
                return f"label {top}, expected labels 0..{NUM_CLASSES - 1}"
    except FileNotFoundError:
        return MISSING
    return None


def idx_problems(folder: Path, counts: Mapping[str, int] = IDX_COUNTS) -> dict[str, str]:
    """File name -> problem for each of the four IDX files in `folder` that is not valid.

    Each split's images and labels are checked against the same count in `counts`, so a
    valid split has as many labels as images.
    """
    problems = {}
    for split in SPLITS:
        for kind in KINDS:
            name = idx_name(split, kind)
            problem = idx_problem(folder / name, kind, counts[split])
            if problem is not None:
                problems[name] = problem
    return problems


def unpack_idx(source: Path, raw: Path, counts: Mapping[str, int] = IDX_COUNTS) -> None:
    """Gunzip the four ``.gz`` IDX files of `source` into `raw`, all or nothing.

    Each file is written under a temporary name in `raw` and checked; the files are renamed
    to their final names only once all four are complete and valid.

    Raises:
        DatasetMissing: a source file is not whole gzip data or not a valid IDX file; no
            file was written under its final name.
    """
    raw.mkdir(parents=True, exist_ok=True)
    staged: dict[Path, Path] = {}
    try:
        for split in SPLITS:
            for kind in KINDS:
                final = raw / idx_name(split, kind)
                src = source / f"{final.name}.gz"
                part = raw / f".{final.name}.{os.getpid()}.part"
                staged[final] = part
                with gzip.open(src, "rb") as packed, part.open("wb") as out:
                    try:
                        shutil.copyfileobj(packed, out, 1 << 20)
                    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                        raise DatasetMissing(f"{src}: not whole gzip data ({exc}); refused, "
                                             f"nothing written to {final}") from exc
                    out.flush()
                    os.fsync(out.fileno())
                problem = idx_problem(part, kind, counts[split])
                if problem is not None:
                    raise DatasetMissing(f"{src}: {problem}; refused, nothing written to "
                                         f"{final}")
        for final, part in staged.items():
            part.replace(final)
    finally:
        for part in staged.values():
            part.unlink(missing_ok=True)


def prepare_dataset(name: str, root: Path, *, system_dir: Path | None = None,
                    download: bool = True, counts: Mapping[str, int] = IDX_COUNTS) -> str:
    """Make dataset `name` loadable from `root`; return a one-line account of what was done.

    Args:
        name: one of `asyncsync.training.catalog.DATASETS`.
        root: the recipes' ``data.root``, the folder of torchvision's datasets.
        system_dir: a folder holding the four gzipped IDX files (mnist, fashion_mnist);
            default: the system package's folder, if the dataset has one.
        download: let torchvision download the files if no local source has them.
        counts: images (and labels) per split of mnist and fashion_mnist.

    Raises:
        ConfigError: an unknown name, or `system_dir` for cifar10.
        DatasetMissing: no source gave valid files (the message says what to do).
    """
    if name == "synthetic":
        return "synthetic: built in (made from the run's seed); nothing to prepare"
    if name not in TORCHVISION:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    if name == "cifar10":
        if system_dir is not None:
            raise ConfigError("--from reads gzipped IDX files (mnist, fashion_mnist); "
                              "cifar10 has none")
        return _prepare_cifar10(root, download)
    return _prepare_idx(name, root, system_dir, download, counts)


def _prepare_idx(name: str, root: Path, system_dir: Path | None, download: bool,
                 counts: Mapping[str, int]) -> str:
    """`prepare_dataset` for mnist and fashion_mnist."""
    cls_name, folder, files, _, _ = TORCHVISION[name]
    raw = root / folder
    sizes = f"{counts['train']:,} train, {counts['t10k']:,} test images"
    problems = idx_problems(raw, counts)
    if not problems:
        return f"{name}: already prepared in {raw} ({sizes}); nothing to do"
    nothing_there = len(problems) == len(SPLITS) * len(KINDS) and set(problems.values()) == {
        MISSING}  # else name every file that is missing or damaged
    broken = [] if nothing_there else [f"{file}: {p}" for file, p in problems.items()]
    tried = [f"{raw}: {'; '.join(broken)}"] if broken else []
    package = SYSTEM_PACKAGES.get(name)
    source = system_dir if system_dir is not None else package.folder if package else None
    if source is not None:
        packed = [f"{idx_name(split, kind)}.gz" for split in SPLITS for kind in KINDS]
        absent = [file for file in packed if not (source / file).is_file()]
        if not absent:
            unpack_idx(source, raw, counts)
            return f"{name}: unpacked {source} into {raw} ({sizes})"
        tried.append(f"{source}: no {', '.join(absent)}")
    if download:
        failure = _download(cls_name, root, raw)
        if failure is None:
            problems = idx_problems(raw, counts)
            if not problems:
                return f"{name}: downloaded by torchvision into {raw} ({sizes})"
            failure = "; ".join(f"{file}: {problem}" for file, problem in problems.items())
        tried.append(f"download: {failure}")
    else:
        tried.append("download: off (--no-download)")
    install = (f"On Debian/Ubuntu: apt install {package.name}, then run `asyncsync data "
               f"{name}` again. Or copy" if package else "Copy")
    raise DatasetMissing(f"{name} is not prepared in {raw}. {install} {files} (gunzipped) "
                         f"into {raw}, or pass --from DIR, a folder holding them gzipped "
                         f"(.gz). Tried: {'; '.join(tried)}")


def _prepare_cifar10(root: Path, download: bool) -> str:
    """`prepare_dataset` for cifar10: the files already there, else torchvision's download."""
    cls_name, folder, files, _, _ = TORCHVISION["cifar10"]
    target = root / folder
    if _cifar10_ready(target):
        return f"cifar10: already prepared in {target} ({CIFAR10_SIZES}); nothing to do"
    if download:
        failure = _download(cls_name, root, target)
        if failure is None:
            return (f"cifar10: prepared by torchvision's download (or from the "
                    f"cifar-10-python.tar.gz in {root}) into {target} ({CIFAR10_SIZES})")
    else:
        failure = "off (--no-download)"
    raise DatasetMissing(f"cifar10 is not prepared in {target}. Copy {files} (extracted from "
                         f"cifar-10-python.tar.gz) into {target}, or put cifar-10-python.tar.gz"
                         f" in {root} and run `asyncsync data cifar10` again without "
                         f"--no-download (torchvision checks its MD5 sum and unpacks it "
                         f"without the network). Tried: download: {failure}")


def _cifar10_ready(folder: Path) -> bool:
    """Whether all of CIFAR-10's files are in `folder` and pass torchvision's MD5 check."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import check_integrity

    listed = [*CIFAR10.train_list, *CIFAR10.test_list,
              [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
    return all(check_integrity(str(folder / file), md5) for file, md5 in listed)


def _download(cls_name: str, root: Path, folder: Path) -> str | None:
    """`asyncsync.training.data.download_files`, imported only when a download is tried
    (it needs torch, which a folder already prepared does not)."""
    from asyncsync.training.data import download_files

    return download_files(cls_name, root, folder)
