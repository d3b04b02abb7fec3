"""Reading torchvision's on-disk dataset formats ourselves, checked, and without pickle.

Two formats: the IDX files of MNIST and Fashion-MNIST (``<split>-images-idx3-ubyte``,
``<split>-labels-idx1-ubyte``) and CIFAR-10's python batches (``data_batch_1`` ..
``data_batch_5``, ``test_batch``). The batches are pickles of a dict; they are read by an
unpickler that admits plain containers, numbers, strings and uint8 arrays rebuilt from their
bytes, and calls nothing else, so a crafted file cannot run code.

Every file is checked before it is used: header, dimensions, size, as many labels as
images, at least one sample, labels ``0..num_classes-1``. A bad file raises
`DatasetFileError` naming it and the problem; nothing is half-loaded.
"""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from asyncsync.errors import InputError

IDX_UBYTE = 0x08
"""The IDX type code of unsigned bytes, the only one MNIST-style files use."""
CIFAR_SIDE = 32
CIFAR_CHANNELS = 3


class DatasetFileError(InputError, ValueError):
    """A dataset file is there but malformed; the message names the file and the problem."""


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """The uint8 array of an IDX file with `ndim` dimensions (3: images, 1: labels).

    Raises:
        DatasetFileError: not an IDX file of unsigned bytes with `ndim` dimensions, or its
            size is not the header plus the payload its dimensions give (truncated, or
            trailing bytes).
    """
    raw = path.read_bytes()
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFileError(f"{path}: {len(raw)} bytes, shorter than the {header}-byte "
                               f"header of an IDX file with {ndim} dimension(s)")
    zeros, kind, found_ndim = raw[:2], raw[2], raw[3]
    if zeros != b"\0\0" or kind != IDX_UBYTE or found_ndim != ndim:
        raise DatasetFileError(f"{path}: header {raw[:4].hex()}, expected 000008{ndim:02x} "
                               f"(IDX, unsigned bytes, {ndim} dimension(s))")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + math.prod(dims)
    if len(raw) != expected:
        cut = "truncated" if len(raw) < expected else "trailing bytes"
        raise DatasetFileError(f"{path}: {len(raw):,} bytes, expected {expected:,} for "
                               f"dimensions {'x'.join(map(str, dims))} ({cut})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_split(folder: Path, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) and labels (N,) of one MNIST-style split (``train`` or ``t10k``)."""
    images_path = folder / f"{split}-images-idx3-ubyte"
    labels_path = folder / f"{split}-labels-idx1-ubyte"
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if 0 in images.shape[1:]:
        raise DatasetFileError(f"{images_path}: images of {images.shape[1]}x"
                               f"{images.shape[2]} pixels")
    check_split(images_path, labels_path, len(images), labels, num_classes)
    return images, labels


def check_split(images_path: Path, labels_path: Path, count: int, labels: np.ndarray,
                num_classes: int) -> None:
    """Refuse a split without samples, with unequal numbers of images and labels, or with
    a label outside ``0..num_classes-1``."""
    if count == 0:
        raise DatasetFileError(f"{images_path}: no samples")
    if len(labels) != count:
        raise DatasetFileError(f"{labels_path}: {len(labels):,} labels for {count:,} images "
                               f"in {images_path.name}")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        raise DatasetFileError(f"{labels_path}: label {bad}, expected labels "
                               f"0..{num_classes - 1} ({num_classes} classes)")


INTEGER_CODES = frozenset({"u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8"})
"""The integer types a pickled array may hold (numpy's type strings, without byte order)."""


class _Array:
    """A numpy array as a pickle describes it, before `as_integers` checks and builds it."""

    def __init__(self) -> None:
        self.state: tuple[Any, ...] = ()

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.state = state

    def as_integers(self, codes: frozenset[str] = INTEGER_CODES) -> np.ndarray:
        """The array, if the pickle described a C-ordered array of one of the integer types
        `codes` whose bytes fit its shape (else ValueError)."""
        if len(self.state) != 5:
            raise ValueError("an array without its shape, type and bytes")
        _, shape, dtype, fortran, payload = self.state
        code = dtype.code() if isinstance(dtype, _DType) else None
        if code is None or code[1:] not in codes:
            expected = "unsigned bytes (u1)" if codes == {"u1"} else "integers"
            raise ValueError(f"an array of {getattr(dtype, 'spec', dtype)!r}, expected "
                             f"{expected}")
        if fortran or not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0
                                                             for d in shape):
            raise ValueError(f"an array of shape {shape!r} (order F: {bool(fortran)})")
        data = payload.encode("latin1") if isinstance(payload, str) else payload
        size = np.dtype(code).itemsize
        if not isinstance(data, bytes | bytearray) or len(data) != size * math.prod(shape):
            raise ValueError(f"an array of shape {shape} whose payload does not fit it")
        return np.frombuffer(bytes(data), dtype=np.dtype(code)).reshape(shape)


class _DType:
    """A numpy dtype as a pickle names it: its type string (``u1``, ``i8``, ...) and, from
    its state, its byte order."""

    def __init__(self, spec: object, *_: object) -> None:
        self.spec = spec
        self.order = "|"

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">", "|", "="):
            self.order = state[1]

    def code(self) -> str | None:
        """The type as byte order and type string (e.g. ``<i8``), or None if it is not a
        string numpy names a plain type by."""
        spec = self.spec
        if not isinstance(spec, str) or not spec or len(spec) > 3:
            return None
        if spec[0] in "<>|=":
            spec, order = spec[1:], spec[0]
        else:
            order = self.order
        if order == "=":
            order = "<" if np.little_endian else ">"
        return order + spec


def _reconstruct(cls: object, shape: object, typecode: object) -> _Array:
    del cls, shape, typecode  # numpy's empty start; the state that follows says it all
    return _Array()


def _frombuffer(payload: object, dtype: object, shape: object, order: object) -> _Array:
    array = _Array()
    array.state = (1, shape, dtype, order == "F", payload)
    return array


def _encode(text: str, encoding: str) -> bytes:
    if encoding not in ("latin1", "latin-1"):
        raise ValueError(f"bytes encoded as {encoding!r}")
    return text.encode("latin1")


_ALLOWED: dict[tuple[str, str], object] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _Array,
    ("numpy", "dtype"): _DType,
    ("_codecs", "encode"): _encode,
}
"""What a CIFAR batch's pickle may name, each mapped to a stand-in of ours; numpy's own
functions are never called."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain containers, numbers and strings, and arrays as `_Array` stand-ins."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which a dataset "
                                         "file has no use for; refused") from None


def read_cifar_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) and labels (N,) of one CIFAR-10 python batch.

    Raises:
        DatasetFileError: not a pickled dict with ``data`` (N x 3072 unsigned bytes) and
            ``labels`` (N integers ``0..num_classes-1``), or it names anything else to
            build.
    """
    try:
        loaded = _PlainUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except OSError:
        raise
    except Exception as exc:  # a hostile or damaged pickle may fail in any of many ways
        raise DatasetFileError(f"{path}: not a CIFAR-10 batch ({type(exc).__name__}: "
                               f"{exc})") from None
    if not isinstance(loaded, dict):
        raise DatasetFileError(f"{path}: holds a {type(loaded).__name__}, expected the dict "
                               "of a CIFAR-10 batch")
    batch = {key.decode("latin1") if isinstance(key, bytes) else key: value
             for key, value in loaded.items()}
    absent = [key for key in ("data", "labels") if key not in batch]
    if absent:
        raise DatasetFileError(f"{path}: no {' or '.join(absent)} in the batch (keys: "
                               f"{', '.join(map(str, batch))})")
    try:
        images = _cifar_images(batch["data"])
        found = batch["labels"]
        labels = (found.as_integers().astype(np.int64) if isinstance(found, _Array)
                  else np.array(found, dtype=np.int64))
        if labels.ndim != 1:
            raise ValueError(f"labels of shape {labels.shape}, expected a list")
    except (ValueError, TypeError, OverflowError) as exc:
        raise DatasetFileError(f"{path}: {exc}") from None
    check_split(path, path, len(images), labels, num_classes)
    return images, labels


def _cifar_images(data: object) -> np.ndarray:
    """A batch's ``data`` (N rows of 3072 bytes, channel-major) as (N, 32, 32, 3)."""
    if not isinstance(data, _Array):
        raise ValueError(f"data is a {type(data).__name__}, expected a uint8 array")
    array = data.as_integers(frozenset({"u1"}))
    row = CIFAR_CHANNELS * CIFAR_SIDE * CIFAR_SIDE
    if array.ndim != 2 or array.shape[1] != row:
        raise ValueError(f"data of shape {array.shape}, expected (N, {row})")
    return array.reshape(-1, CIFAR_CHANNELS, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
