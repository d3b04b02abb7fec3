"""NBSync: local computing and global synchronization run in parallel.

Worker: trains local SGD continuously and never blocks on the network. It keeps an anchor
``a`` and at most one synchronization in flight: push a delta, then pull the new global
model, as a background task. At the first step boundary after that task completes,
``d <- w_i - a`` (the progress made while the synchronization was in flight),
``w_i <- w_new``, ``a <- w_new``, and the next synchronization starts at once with ``d``.
Local steps per round are therefore flexible and differentiated: fast workers do more,
slow workers at least one. The first synchronization starts after the first local step and
pushes that step; its anchor is the local model at that moment.

Server: with ``server_mode = "sync"`` (the default) it collects one delta per live worker
per round, then ``w <- w + mean_i delta_i``, version += 1, and answers the pulls. With
``server_mode = "async"`` it applies ``w <- w + delta / N`` on arrival (N: the live
workers), one version per delta, and answers pulls at once.

Choices: synchronous rounds by default, the asynchronous form as the ``server_mode``
parameter.

Reference: H. Zhou, Z. Li, H. Yu, L. Luo, G. Sun, "NBSync: Parallelism of Local Computing
and Global Synchronization for Fast Distributed Machine Learning in WANs", IEEE Transactions
on Services Computing, 2023 (doi:10.1109/TSC.2023.3304312).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import (
    Protocol,
    Pull,
    Push,
    Reply,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.overlap import OverlapWorker, Pulled
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import RoundServer

SERVER_MODES = ("sync", "async")


@dataclass(frozen=True)
class NbsyncParams:
    """NBSync's parameters."""

    NOT_OFFERED = no_round_policies(
        "nbsync", "its rounds overlap local steps: no worker waits for one to close")

    server_mode: str = option("sync", lambda v: v in SERVER_MODES,
                              f"must be one of {', '.join(SERVER_MODES)}",
                              "sync: one delta per worker per round; async: apply on arrival")

    def __post_init__(self) -> None:
        check_fields(self)


class NbsyncServer(RoundServer[NbsyncParams]):
    """Rounds of one delta per live worker (or every delta on arrival, in async mode).

    Sync mode: a lost worker's delta of the open round counts if it arrived, else the round
    closes with the others'; a rejoined worker's first delta, based on the version it joined at,
    belongs to the open round, which waits for it. Async mode: a delta counts ``1/n`` with
    n the live workers when it arrives; nobody waits for anybody.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: NbsyncParams, store: Store) -> None:
        super().__init__(params, store)
        self.synchronous = params.server_mode == "sync"

    async def on_push(self, push: Push) -> dict[str, Any]:
        if self.synchronous:
            return await super().on_push(push)
        async with self.store.lock:
            w, n = self.store.w, max(1, len(self.store.live))
            new = await self.store.compute(lambda: w + push.vector / n)
            self.store.commit(new, [(push.worker, push.base_version)])
        return {}

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``w + mean delta``."""
        return current + mean

    async def on_pull(self, pull: Pull) -> Reply:
        if self.synchronous:
            return await super().on_pull(pull)
        return self.store.current()


class NbsyncWorker(OverlapWorker[NbsyncParams]):
    """Push the progress of the last round, then pull the next global model."""

    async def send_progress(self, ctx: Context, delta: torch.Tensor, steps: int,
                       samples: int) -> Pulled:
        await ctx.push("delta", delta, steps=steps, samples=samples)
        vector, version, _ = await ctx.pull()
        return vector, version


NBSYNC = register(Protocol("nbsync", "non-blocking sync: local SGD never stops; one delta "
                                     "push + model pull always in flight",
                           NbsyncParams, NbsyncServer, NbsyncWorker))
