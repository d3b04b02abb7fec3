"""A request of a session still held inside a rule (e.g. a pull at a BSP barrier) when a
restarted copy of its worker takes the rank over ends then, refused (410), instead of
waiting on in the new session's name to be answered into a dead connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import NotInRun
from tests.helpers import tiny_model

RUN = "held"


async def join(core: ServerCore, rank: int) -> str:
    reply, _ = await core.handle("join", {"run_id": RUN, "worker": rank}, None)
    return str(reply["meta"]["session"])


def push(rank: int, session: str, seq: int) -> dict[str, Any]:
    return {"run_id": RUN, "worker": rank, "session": session, "seq": seq, "base_version": 0,
            "kind": "gradient", "steps": 1, "samples": 1}


async def test_a_pull_held_at_a_barrier_ends_when_its_session_is_taken_over() -> None:
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(run_id=RUN))
    numel = core.store.numel
    old, other = await asyncio.gather(join(core, 0), join(core, 1))
    await core.handle("push", push(0, old, 1), torch.zeros(numel))
    held = asyncio.ensure_future(core.handle(
        "pull", {"run_id": RUN, "worker": 0, "session": old, "base_version": 0}, None))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not held.done()  # worker 1 has not pushed: the round is open
    new = await join(core, 0)  # a restarted copy of worker 0 (no secret): takes it over
    for _ in range(20):
        await asyncio.sleep(0)
    assert held.done(), "the old session's pull still waits in the new session's name"
    with pytest.raises(NotInRun, match=r"taken over"):
        held.result()
    # the new session's round completes without it, and both its members are answered
    await core.handle("push", push(1, other, 1), torch.zeros(numel))
    await core.handle("push", push(0, new, 1), torch.zeros(numel))
    reply, vector = await core.handle(
        "pull", {"run_id": RUN, "worker": 0, "session": new, "base_version": 0}, None)
    assert reply["version"] == 1 and vector is not None
    assert 0 not in core.store.held
    await core.stop()
    await core.close()
