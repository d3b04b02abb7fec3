"""The parameter store's bookkeeping of held requests, found by mutation testing."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import NotInRun, Unacceptable
from asyncsync.training.optim import FlatSGD


def test_a_rank_stays_held_while_any_of_its_requests_is_held() -> None:
    # A worker may have two requests held at once (a background exchange beside its loop's
    # pull): the status says "waiting" until the last of them is answered.
    store = ParameterStore(torch.zeros(2), 1, FlatSGD(0.1))
    store.live.add(0)
    first_due, second_due = False, False

    async def scenario() -> list[bool]:
        first = asyncio.create_task(store.wait_for(lambda: first_due, 0))
        second = asyncio.create_task(store.wait_for(lambda: second_due, 0))
        await asyncio.sleep(0)
        seen = [0 in store.held]
        nonlocal first_due
        first_due = True
        store.notify()
        await first
        seen.append(0 in store.held)  # the second request still waits
        nonlocal second_due
        second_due = True
        store.notify()
        await second
        seen.append(0 in store.held)
        return seen

    assert asyncio.run(scenario()) == [True, True, False]


def test_a_commit_of_a_non_finite_vector_is_refused_and_changes_nothing() -> None:
    # a rule's average can overflow (two pushes of 3e38 in float32): the commit is refused
    store = ParameterStore(torch.tensor([1.0, 2.0]), 2, FlatSGD(0.1))
    pushed = torch.tensor([3e38, 1.0])

    async def commit() -> None:
        async with store.lock:
            with pytest.raises(Unacceptable, match="non-finite"):
                store.commit(pushed + pushed, [(0, 0), (1, 0)])

    asyncio.run(commit())
    assert store.version == 0 and store.w.tolist() == [1.0, 2.0] and not store.commits


def test_a_held_request_of_a_dropped_session_is_not_answered_in_the_next_ones_name() -> None:
    # the rank is dropped and rejoins before its held request wakes: the request belongs
    # to the session that ended, so it is refused (NotInRun) though its condition now holds
    store = ParameterStore(torch.zeros(2), 1, FlatSGD(0.1))
    store.live.add(0)
    due = False

    async def scenario() -> None:
        held = asyncio.create_task(store.wait_for(lambda: due, 0))
        await asyncio.sleep(0)
        nonlocal due
        store.drop(0)
        store.live.add(0)  # the new session joins at once
        due = True
        store.notify()
        with pytest.raises(NotInRun, match="worker 0 was dropped"):
            await held

    asyncio.run(scenario())


def test_a_condition_that_raises_ends_its_request_with_that_error() -> None:
    # the check that resumes held requests swallows the error; the request, resumed,
    # checks again itself and so raises it
    store = ParameterStore(torch.zeros(2), 1, FlatSGD(0.1))
    store.live.add(0)
    broken = False

    def ready() -> bool:
        if broken:
            raise KeyError("round 7")
        return False

    async def scenario() -> None:
        held = asyncio.create_task(store.wait_for(ready, 0))
        await asyncio.sleep(0)
        nonlocal broken
        broken = True
        store.notify()
        with pytest.raises(KeyError, match="round 7"):
            await asyncio.wait_for(held, 5)

    asyncio.run(scenario())
    assert 0 not in store.held


def test_held_seconds_count_from_the_wait_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ParameterStore(torch.zeros(2), 1, FlatSGD(0.1))
    store.live.add(0)
    clock = [10.0]
    monkeypatch.setattr(store, "now", lambda: clock[0])
    due = [False]

    async def scenario() -> None:
        for began, ended in ((10.0, 12.5), (20.0, 20.25)):
            due[0], clock[0] = False, began
            held = asyncio.create_task(store.wait_for(lambda: due[0], 0))
            await asyncio.sleep(0)
            due[0], clock[0] = True, ended
            store.notify()
            await held

    asyncio.run(scenario())
    assert store.held_s == {0: 2.5 + 0.25}
