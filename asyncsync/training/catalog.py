"""The models and datasets asyncsync knows, without loading any: their names, torchvision's
files and normalization, and the error for files that are absent. No torch here, so the command line
can name them before it imports torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from asyncsync.errors import InputError

MODELS = ("mlp", "cnn", "resnet18", "timing")
"""The models a recipe may name (`asyncsync.training.models` builds them), besides a
``package.module:callable`` of the user's."""

DATASETS = ("synthetic", "mnist", "fashion_mnist", "cifar10")
"""The datasets a recipe may name: the built-in synthetic task, then torchvision's."""

TORCHVISION = {
    "mnist": ("MNIST", "MNIST/raw", "train-images-idx3-ubyte, train-labels-idx1-ubyte, "
              "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte", (0.1307,), (0.3081,)),
    "fashion_mnist": ("FashionMNIST", "FashionMNIST/raw", "train-images-idx3-ubyte, "
                      "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                      "t10k-labels-idx1-ubyte", (0.2860,), (0.3530,)),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", "data_batch_1..5, test_batch, batches.meta",
                (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""Per torchvision dataset: its class name, its folder under the data root, the files it
expects, and its channel means and standard deviations for normalization."""


class DatasetMissing(InputError, ValueError):
    """A dataset's files are absent and could not be downloaded."""


@contextlib.contextmanager
def no_empty_folders_left(folder: Path) -> Iterator[None]:
    """On a failure inside the block, remove `folder` and those of its parents that the
    block made, if they are empty (a failed download leaves no empty ``raw`` folder)."""
    absent = []
    path = folder
    while not path.exists() and path != path.parent:
        absent.append(path)
        path = path.parent
    try:
        yield
    except BaseException:
        for made in absent:  # the deepest first; a folder holding anything stays
            with contextlib.suppress(OSError):
                made.rmdir()
        raise
