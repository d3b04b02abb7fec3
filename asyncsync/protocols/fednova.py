"""FedNova: normalized averaging, so that unequal local work does not bias the model.

Worker: wait until the server has a round for it, adopt the round's model ``w``, run
``tau_i`` local SGD steps, push the delta ``delta_i = w_i - w`` with ``steps = tau_i``.
With a time budget (``budget_s > 0``) ``tau_i`` is as many steps as fit in the budget, so
fast workers do more; otherwise ``tau_i = H`` (``local_steps``). Server: when every live
participant of the round has pushed, each delta is normalized by its step count,
``d_i = delta_i / tau_i``, and rescaled by the effective step count,
``delta = tau_eff sum_i p_i d_i`` with ``tau_eff = sum_i p_i tau_i``; the server optimizer
(`asyncsync.protocols.server_optim`) steps the parameters on ``-delta`` (sgd at lr 1:
``w <- w + delta``), buffers (BatchNorm statistics) take the ``p_i``-weighted mean of the
deltas. Then version += 1. With equal step counts this is FedAvg's ``w + sum_i p_i delta_i``.
``p_i = n_i / sum_j n_j`` is worker i's share of the round's data: a worker whose batches
come from a shard of known size (`Context.shard_size`) sends it with its delta (meta
``shard``), as the paper's clients hold ``n_i`` samples.

Rounds and membership are local SGD's (`asyncsync.protocols.local_sgd`): every live worker
takes part in every round, a lost worker's delta counts if it arrived before it left
(else the round closes with the others'), a rejoined worker joins the open round.

Choices where the paper is open or does not fit:

- **(choice)** Where a delta of the round does not say its shard's size (a worker whose
  batch source does not tell), ``p_i = 1/n`` over the round's n deltas. The samples a push
  carries are not used: they measure work done (proportional to ``tau_i``), which would
  bring back the bias.
- **(choice)** The normalizer is ``a_i = tau_i``, the paper's for plain local SGD; with
  local momentum or a proximal term the paper's ``a_i`` differs and the normalization is
  approximate.
- **(choice)** The budget counts the seconds charged to local steps
  (``StepResult.compute_s``: measured time in real mode, virtual time in virtual mode),
  not waiting or transfers. A worker takes another step while the last step's duration
  still fits in what is left of the budget, and always at least one step.
- **(choice)** A delta's step count scales every delta of its round (through
  ``tau_eff``), so it is bounded as a push's samples are: at most ``max_steps`` (a
  worker with a budget stops there); more is refused.

Reference: J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncsync.protocols.base import (
    Protocol,
    Push,
    Unacceptable,
    WorkerLoop,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.local_sgd import LocalSgdServer
from asyncsync.protocols.ports import Context, StepResult
from asyncsync.protocols.rounds import Cutoff
from asyncsync.protocols.server_optim import ServerOptimizerOptions, apply_delta

_LOCAL_STEPS = 8
"""H without a budget (the default of `local_steps`)."""


@dataclass(frozen=True)
class FedNovaParams(ServerOptimizerOptions, Cutoff):
    """Parameters of FedNova (with the server optimizer's and the round policies)."""

    local_steps: int = option(_LOCAL_STEPS, lambda v: v >= 1, "must be >= 1",
                              "H: local steps per round when there is no budget")
    budget_s: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                             "seconds of local computation per round (0: H steps)")
    max_steps: int = option(10_000, lambda v: v >= 1, "must be >= 1",
                            "the most local steps a delta may claim (more is refused); "
                            "a worker with a budget stops there")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_cutoff()
        self.check_server_optimizer()
        if self.budget_s and self.local_steps != _LOCAL_STEPS:
            raise ValueError("local_steps: not used with a time budget (budget_s decides each "
                             "round's steps, up to max_steps); leave this key out")
        if not self.budget_s and self.local_steps > self.max_steps:
            raise ValueError(f"max_steps: must be >= local_steps ({self.local_steps}), "
                             f"got {self.max_steps}")


SHARD_BOUND = 2**40
"""The largest shard a delta may claim (more is refused)."""


def shard_of(push: Push) -> int | None:
    """The shard size a delta claims (meta ``shard``), None if it claims none.

    Raises:
        Unacceptable: the claim is not an int in ``1..SHARD_BOUND``.
    """
    shard = push.meta.get("shard")
    if shard is None:
        return None
    if not isinstance(shard, int) or isinstance(shard, bool) or not 1 <= shard <= SHARD_BOUND:
        raise Unacceptable(f"fednova: meta 'shard' must be an int in 1..{SHARD_BOUND} "
                           f"(the samples of the worker's shard), got {shard!r}")
    return shard


def shares(pushes: list[Push]) -> list[float]:
    """Each delta's ``p_i``: its shard's share of the round's data when every delta says
    its shard's size, else ``1/n``."""
    shards = [shard_of(push) for push in pushes]
    if any(shard is None for shard in shards):
        return [1 / len(pushes)] * len(pushes)
    total = sum(shard for shard in shards if shard is not None)
    return [(shard or 0) / total for shard in shards]


def normalized(pushes: list[Push], num_params: int) -> torch.Tensor:
    """``tau_eff sum_i p_i d_i`` with ``d_i = delta_i / tau_i`` on the parameters, the
    ``p_i``-weighted mean delta on the buffers."""
    p = shares(pushes)
    tau_eff = sum(p_i * push.steps for p_i, push in zip(p, pushes, strict=True))
    total = torch.zeros_like(pushes[0].vector)
    for p_i, push in zip(p, pushes, strict=True):
        total[:num_params].add_(push.vector[:num_params], alpha=tau_eff * p_i / push.steps)
        total[num_params:].add_(push.vector[num_params:], alpha=p_i)
    return total


class FedNovaServer(LocalSgdServer):
    """Local SGD's rounds; each round's deltas normalized by their step counts."""

    def weight(self, push: Push) -> float:
        """Each delta must say how many steps it took, and may say its shard's size (the
        weights are the round's `shares`, from `aggregate`)."""
        shard_of(push)
        if push.steps < 1:
            raise Unacceptable("fednova normalizes deltas by their steps: 'steps' must be >= 1")
        bound = self.params.max_steps
        if push.steps > bound:
            raise Unacceptable(f"{push.steps} steps: more than fednova's bound of {bound} "
                               "local steps per round (max_steps)")
        return 1.0

    def aggregate(self, w: torch.Tensor, pushes: list[Push]) -> torch.Tensor:
        """The server step on ``tau_eff sum_i p_i delta_i / tau_i``."""
        num_params = self.store.num_params
        return apply_delta(self.optimizer, w, normalized(pushes, num_params), num_params)


class FedNovaWorker(WorkerLoop):
    """Pull a round's model, run H steps or as many as the budget holds, push the delta."""

    async def run(self, ctx: Context) -> None:
        anchor, version, _ = await ctx.pull()
        while True:
            await ctx.adopt(anchor, version)
            steps, samples = await self.local_work(ctx)
            delta = await ctx.delta_since(anchor)
            del anchor  # adopted: not held while the worker waits for its next round
            meta = None if ctx.shard_size is None else {"shard": ctx.shard_size}
            exchange = ctx.push_and_pull("delta", delta, steps=steps, samples=samples, meta=meta)
            del delta  # the request holds it only until it is sent
            anchor, version, _ = await exchange

    async def local_work(self, ctx: Context) -> tuple[int, int]:
        """Run this round's local steps; ``(steps, samples)``."""
        params: FedNovaParams = self.params
        if not params.budget_s:
            return params.local_steps, (await ctx.steps(params.local_steps)).samples
        steps, samples, spent = 0, 0, 0.0
        last: StepResult | None = None
        while last is None or (spent + last.compute_s <= params.budget_s
                               and steps < params.max_steps):
            last = await ctx.steps(1)
            steps, samples, spent = steps + 1, samples + last.samples, spent + last.compute_s
        return steps, samples


FEDNOVA = register(Protocol("fednova", "normalized averaging: deltas divided by their local "
                                       "steps, rescaled by the effective step count",
                            FedNovaParams, FedNovaServer, FedNovaWorker))
