"""Local SGD's round, by hand: exactly H local steps, and the mean over the round's deltas.

PROTOCOLS.md: ``w <- w + sum_i (1/n) delta_i`` with n the deltas of the round; with a
backup worker the round closes with N - 1 deltas, and their mean is over those N - 1
(dividing by N would shrink every step a round closes early).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.base import Push, RunStopped
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer, LocalSgdWorker
from asyncsync.protocols.testing import FakeContext, FakeStore


async def test_a_round_closed_by_backup_workers_averages_over_its_deltas() -> None:
    store = FakeStore(torch.zeros(2), 3)
    rule = LocalSgdServer(LocalSgdParams(backup_workers=1), store)
    await rule.on_push(Push(2, 0, "delta", torch.tensor([3.0, -1.0]), 8, 128))
    await rule.on_push(Push(0, 0, "delta", torch.tensor([1.0, 5.0]), 8, 128))
    assert store.version == 1
    assert torch.allclose(store.w, torch.tensor([2.0, 2.0]))  # (d2 + d0) / 2


async def test_the_worker_runs_exactly_h_local_steps_per_round() -> None:
    w0 = torch.tensor([1.0, -2.0])
    store = FakeStore(w0.clone(), 1)
    rule = LocalSgdServer(LocalSgdParams(local_steps=3), store)
    ctx = FakeContext(store, rule, max_steps=6, lr=0.1)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(LocalSgdWorker(LocalSgdParams(local_steps=3)).run(ctx), 5)
    # the loss |w|^2 / 2: a step at lr 0.1 scales w by 0.9; three of them by 0.729
    first, second = ctx.pushed
    assert first.steps == second.steps == 3
    assert torch.allclose(first.vector, w0 * (0.9**3 - 1))
    assert torch.allclose(second.vector, w0 * 0.9**3 * (0.9**3 - 1))
    assert ctx.done == 6
