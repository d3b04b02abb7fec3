"""Overlap Local SGD: local steps never wait for the averaging of the anchor model.

Each worker keeps its local model ``w_i`` and an anchor ``z``, the average of all local
models at the previous synchronization point (initially the starting model). Every tau
local steps (default 8) the worker takes the result of the averaging it started tau steps
earlier as the new anchor (waiting only if it is still in flight), pulls its local model
toward it, ``w_i <- (1 - alpha) w_i + alpha z`` (alpha 0.2), pushes the pulled model and
averages it in the background while the next tau local steps run. Server: when the models
of every live worker are in, ``w <- mean_i w_i``, version += 1, and the pulls are released. The
anchor is thus one round old, and communication is hidden whenever one averaging takes less
than tau local steps.

**(choice)** As in the authors' code, the pushed (averaged) model is the local model
after its pull toward the anchor; alpha = 1 is therefore refused: each local model would
be reset to the anchor and pushed as it is, and the average would never move.

The background exchanges are `asyncsync.protocols.overlap.Transfers`.

Reference: J. Wang, H. Liang, G. Joshi, "Overlap Local-SGD: An Algorithmic Approach to Hide
Communication Delays in Distributed SGD", ICASSP 2020.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncsync.protocols.base import (
    Protocol,
    WorkerLoop,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.overlap import Pulled, Transfers, push_then_pull
from asyncsync.protocols.ports import Context
from asyncsync.protocols.rounds import RoundServer


@dataclass(frozen=True)
class OverlapLocalSgdParams:
    """Parameters of Overlap Local SGD."""

    NOT_OFFERED = no_round_policies(
        "overlap_local_sgd", "its rounds overlap local steps: no worker waits for one to close")

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "tau: local steps between synchronization points")
    alpha: float = option(0.2, lambda v: 0 < v < 1,
                          "must be in (0, 1) (at 1 every local model is reset to the anchor "
                          "and pushed as it is: the average would never move)",
                          "how far the local model is pulled toward the anchor")

    def __post_init__(self) -> None:
        check_fields(self)


class OverlapLocalSgdServer(RoundServer[OverlapLocalSgdParams]):
    """A barrier per round: the new anchor is the mean of the live workers' pushed models.

    Lost and rejoining workers are handled by `RoundServer`: a lost worker's model counts
    in the open round if it arrived, and a rejoined worker's first model (pulled toward the
    global model it joined with) belongs to the open round.
    """

    push_kinds = frozenset({"model"})

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return mean


class OverlapLocalSgdWorker(WorkerLoop[OverlapLocalSgdParams]):
    """tau local steps in one block; pull toward the anchor; average in the background.

    A failed averaging (e.g. the run stopped) surfaces when its result is taken, at the end
    of the block of local steps that ran while it was in flight.
    """

    async def run(self, ctx: Context) -> None:
        tau, alpha = self.params.local_steps, self.params.alpha
        anchor = await ctx.snapshot()
        version = ctx.version
        async with Transfers[Pulled]() as transfers:
            while True:
                samples = (await ctx.steps(tau)).samples
                if 0 in transfers:
                    anchor, version = await transfers.finish(0)
                await ctx.mix_toward(anchor, alpha)
                model = await ctx.snapshot()
                transfers.start(0, push_then_pull(ctx, "model", model, steps=tau, samples=samples,
                                            base_version=version))


OVERLAP_LOCAL_SGD = register(Protocol(
    "overlap_local_sgd", "local SGD pulled toward an anchor averaged in the background",
    OverlapLocalSgdParams, OverlapLocalSgdServer, OverlapLocalSgdWorker))
