"""FedAvg's ``local_epochs``: refused up front where no shard size exists (the timing
model), and the round plan it hands out, short last step included (a single sample when
``E n_k mod B == 1``); expected plans computed here from ``E n_k = q B + r``."""

from __future__ import annotations

import pytest
import torch

from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer, FedAvgWorker
from asyncsync.protocols.testing import FakeContext, FakeStore, checked_context


def test_local_epochs_without_shard_sizes_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"^local_epochs: the run's batches tell no shard "
                                         r"size .*set local_steps instead"):
        FedAvgParams(local_epochs=1).check_shards(known=False)
    FedAvgParams(local_epochs=1).check_shards(known=True)
    FedAvgParams().check_shards(known=False)  # H steps need no shard


def _plan(epochs: int, shard: int, batch: int) -> list[tuple[int, int]]:
    params = FedAvgParams(local_epochs=epochs)
    store = FakeStore(torch.zeros(3), 1)
    ctx = FakeContext(store, FedAvgServer(params, store), batch_size=batch, shard_size=shard)
    return FedAvgWorker(params).plan(checked_context(ctx))


@pytest.mark.parametrize(("epochs", "shard", "batch", "expected"), [
    (1, 33, 32, [(1, 32), (1, 1)]),  # 33 = 1 * 32 + 1: the last step is one sample
    (3, 11, 4, [(8, 4), (1, 1)]),  # E n = 33 = 8 * 4 + 1
    (2, 16, 8, [(4, 8)]),  # 32 = 4 * 8: no short step
    (1, 5, 8, [(1, 5)]),  # E n < B: one short step only
    (2, 7, 5, [(2, 5), (1, 4)]),  # 14 = 2 * 5 + 4
])
def test_a_round_is_q_steps_of_b_then_one_of_the_rest(
        epochs: int, shard: int, batch: int, expected: list[tuple[int, int]]) -> None:
    plan = _plan(epochs, shard, batch)
    assert plan == expected
    assert sum(count * size for count, size in plan) == epochs * shard  # E epochs exactly
