"""Parameters that can only be judged against the run's size say so through
``check_workers(workers)`` (as `Cutoff` does for backup workers), so that a recipe check
can refuse them before the run, naming the key; the servers refuse them the same way."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD
from asyncsync.protocols.lbbsp import LbbspParams, LbbspServer
from asyncsync.protocols.wbsp import WbspParams, WbspServer


def store(workers: int) -> ParameterStore:
    return ParameterStore(torch.zeros(4), workers, FlatSGD(0.1))


def test_wbsp_slow_worker_must_be_a_rank_of_the_run() -> None:
    WbspParams(slow_worker=2).check_workers(3)
    WbspParams().check_workers(1)
    with pytest.raises(ValueError, match=r"^slow_worker: must be a rank below 3, got 3"):
        WbspParams(slow_worker=3).check_workers(3)
    with pytest.raises(ValueError, match=r"^slow_worker:"):
        WbspServer(WbspParams(slow_worker=3), store(3))


def test_lbbsp_global_batch_must_split_among_the_workers() -> None:
    LbbspParams(global_batch=3).check_workers(3)
    LbbspParams().check_workers(100)
    with pytest.raises(ValueError, match=r"^global_batch: 2 samples cannot be split among 3"):
        LbbspParams(global_batch=2).check_workers(3)
    with pytest.raises(ValueError, match=r"^global_batch: 100 samples cannot be split among 3"):
        LbbspParams(global_batch=100, max_batch=10).check_workers(3)
    with pytest.raises(ValueError, match=r"^global_batch:"):
        LbbspServer(LbbspParams(global_batch=2), store(3))
