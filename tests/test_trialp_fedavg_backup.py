"""FedAvg's backup workers count within the round, which holds the k = max(1, round(C N))
sampled workers, not N: with C = 0.5 of 4 workers and backup_workers = 2 (accepted, as
2 < 4) every round closed with its first delta and dropped the other, even at equal
speeds (29 of 58 deltas dropped in a 3 s virtual run). Such a value is refused, naming
the key, by the parameters' check against the run's size (which `asyncsync check` and
the server both call)."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer


def test_backup_workers_must_leave_a_sampled_worker_to_wait_for() -> None:
    FedAvgParams(fraction=0.5, backup_workers=1).check_workers(4)
    FedAvgParams(backup_workers=3).check_workers(4)
    for backup in (2, 3):
        with pytest.raises(ValueError, match=r"^backup_workers: must be < the 2 workers a "
                                             r"round samples"):
            FedAvgParams(fraction=0.5, backup_workers=backup).check_workers(4)
    with pytest.raises(ValueError, match=r"^backup_workers:"):
        FedAvgServer(FedAvgParams(fraction=0.5, backup_workers=2),
                     ParameterStore(torch.zeros(4), 4, FlatSGD(0.1)))

