"""Tests run with one torch thread: the CI machine has 2 cores.

`make test` runs the suite in 2 pytest-xdist processes (``-n 2 --dist loadgroup``). The
modules whose tests start processes or read the real clock are held in two groups, each run
by one process in turn: so a real-clock test never runs beside another real-clock test or
beside another multi-process study, only beside single-process tests (at most one busy core,
the load every test must stand).
"""

import os
import signal
from collections.abc import Iterator

import pytest
import torch

torch.set_num_threads(1)
for _inherited in ("COLUMNS", "LINES"):  # the tests that print tables set their widths;
    os.environ.pop(_inherited, None)     # a shell's, or pytest-xdist's 80x24, is dropped

XDIST_GROUPS = {
    "real-clock": {"test_availability.py", "test_cli.py", "test_connections.py",
                   "test_descriptors.py", "test_e2e.py", "test_faults.py",
                   "test_kernel_network.py", "test_multinode.py", "test_network.py",
                   "test_protocol_lbbsp.py", "test_slow_bodies.py", "test_tls.py"},
    "studies": {"test_cost_model_runs.py", "test_docs.py", "test_parallel.py",
                "test_slurm.py", "test_tracking.py", "test_tracking_parallel.py",
                "test_virtual.py"},
}
"""Modules whose tests start processes or read the real clock (see the module docstring)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for group, modules in XDIST_GROUPS.items():
            if item.path.name in modules:
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C works as from a terminal even when pytest itself was started with SIGINT
    ignored (e.g. as a background job, ``cmd &``, of a non-interactive shell, which is
    inherited and keeps Python from installing its handler): Python's handler in this
    process for the test, and so the default disposition in the processes it starts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
