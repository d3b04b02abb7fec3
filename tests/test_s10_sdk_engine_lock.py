"""The engine refuses a commit made without holding ``store.lock`` (a lost-update race)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.training.optim import FlatSGD


def test_a_commit_outside_the_lock_is_an_error_and_changes_nothing() -> None:
    store = ParameterStore(torch.zeros(3), 1, FlatSGD(0.1))

    async def commits() -> None:
        with pytest.raises(RuntimeError, match=r"without holding store\.lock"):
            store.commit(torch.ones(3), [(0, 0)])
        with pytest.raises(RuntimeError, match=r"without holding store\.lock"):
            await store.apply_gradient(torch.ones(3), [(0, 0)])
        assert store.version == 0 and torch.equal(store.w, torch.zeros(3))
        async with store.lock:
            store.commit(torch.ones(3), [(0, 0)])
        assert store.version == 1

    asyncio.run(commits())
