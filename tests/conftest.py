"""Tests run with one torch thread: the CI machine has 2 cores."""

import signal
from collections.abc import Iterator

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C works as from a terminal even when pytest itself was started with SIGINT
    ignored (e.g. as a background job, ``cmd &``, of a non-interactive shell, which is
    inherited and keeps Python from installing its handler): Python's handler in this
    process for the test, and so the default disposition in the processes it starts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
