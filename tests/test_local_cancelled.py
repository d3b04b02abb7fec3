"""A request abandoned by its caller (a worker killed, or taken offline mid-request) runs to
its end on the in-process transport, as over HTTP; if the server then refuses it, nobody is
left to hear, and that is not an error to print.

A population run with an availability trace printed "Task exception was never retrieved
... NotInRun" whenever a worker went offline while its request was held.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from asyncsync.protocols.messages import NotInRun
from asyncsync.transport.local import LocalTransport


class RefusingCore:
    """A server core that holds each request a moment, then refuses it."""

    def __init__(self) -> None:
        self.finished = asyncio.Event()

    def tensor_numel(self, op: str, header: dict[str, Any]) -> None:
        return None

    async def handle(self, op: str, header: dict[str, Any], vector: Any) -> Any:
        await asyncio.sleep(0.05)
        self.finished.set()
        raise NotInRun("the worker left while its request was held")


def test_a_refused_request_whose_caller_was_cancelled_is_not_reported() -> None:
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        core = RefusingCore()
        transport = LocalTransport(core)  # type: ignore[arg-type]
        caller = asyncio.create_task(transport.request("push", {"rank": 0}))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await core.finished.wait()
        await asyncio.sleep(0)
        gc.collect()

    asyncio.run(main())
    assert not reported, reported


def test_a_refusal_still_reaches_a_caller_that_waits() -> None:
    async def main() -> None:
        transport = LocalTransport(RefusingCore())  # type: ignore[arg-type]
        with pytest.raises(NotInRun, match="left while its request was held"):
            await transport.request("push", {"rank": 0})

    asyncio.run(main())
