"""DiLoCo: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient.

Worker: starting from the global model ``w``, run H local (inner) SGD steps and push its
progress ``d_i = w_i - w``; pull the next global model and adopt it. Server: when the
deltas of every live worker are in, the pseudo-gradient is ``g = -mean_i d_i`` and
``w <- w - outer.update(w, g)`` on the parameters, where ``outer`` is SGD with Nesterov
momentum (lr 0.7, momentum 0.9); buffers (BatchNorm statistics) take no outer step, they
become the workers' mean, ``w + mean_i d_i``. Then version += 1 and the pulls are
released. Outer momentum 0 gives plain outer SGD (lr 1 is then local SGD's averaging). The
inner optimizer is the worker's local SGD (the paper uses AdamW).

The barrier is the SDK's `RoundServer` (per fragment: Streaming DiLoCo splits the model);
a lost worker's delta of an open round is withdrawn and the round closes with the
others', and a rejoined worker takes part in the open round from the model it joined with.
The outer optimizer's momentum is part of the server's checkpoint.

**(choice)** Workers push the delta ``w_i - w`` and the server negates the mean: the same
pseudo-gradient, with one vector operation on each side.

Reference: A. Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv:2311.08105, 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncsync.protocols.base import (
    FlatSGD,
    Protocol,
    WorkerLoop,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import RoundServer


@dataclass(frozen=True)
class DilocoParams:
    """Parameters of DiLoCo."""

    inner_steps: int = option(50, lambda v: v >= 1, "must be >= 1",
                              "H: local (inner) steps between outer steps")
    outer_lr: float = option(0.7, lambda v: v > 0, "must be > 0", "outer learning rate")
    outer_momentum: float = option(0.9, lambda v: 0 <= v < 1, "must be in [0, 1)",
                                   "outer Nesterov momentum (0: plain outer SGD)")

    def __post_init__(self) -> None:
        check_fields(self)


class DilocoServer(RoundServer):
    """Outer Nesterov SGD on the negated mean delta of the parameters, with momentum per
    fragment; buffers become the workers' mean. The outer momentum buffers are the rule's
    checkpoint state."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: DilocoParams, store: Store) -> None:
        super().__init__(params, store)
        self.outer = [FlatSGD(params.outer_lr, params.outer_momentum,
                              nesterov=params.outer_momentum > 0) for _ in self.bounds]

    def parameter_count(self, fragment: int) -> int:
        """How many leading elements of the fragment are parameters (the rest: buffers)."""
        start, stop = self.bounds[fragment]
        return min(max(self.store.num_params - start, 0), stop - start)

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        split = self.parameter_count(fragment)
        new = current + mean  # buffers: the workers' mean
        new[:split] = current[:split] - self.outer[fragment].update(current[:split],
                                                                    -mean[:split])
        return new

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The outer momentum buffer of each fragment that has one."""
        return {f"outer.{fragment}.momentum": outer.momentum_buffer
                for fragment, outer in enumerate(self.outer)
                if outer.momentum_buffer is not None}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for fragment, outer in enumerate(self.outer):
            buffer = state.get(f"outer.{fragment}.momentum")
            if buffer is not None:
                size = self.parameter_count(fragment)
                if buffer.shape != (size,):
                    raise ValueError(f"outer momentum of fragment {fragment} has shape "
                                     f"{tuple(buffer.shape)}, the fragment {size} parameters")
                outer.momentum_buffer = buffer.clone()


class DilocoWorker(WorkerLoop):
    """H inner steps, push ``w_i - w``, adopt the new global model."""

    async def run(self, ctx: Context) -> None:
        steps = self.params.inner_steps
        anchor = await ctx.snapshot()
        while True:
            result = await ctx.steps(steps)
            delta = await ctx.delta_since(anchor)
            await ctx.push("delta", delta, steps=steps, samples=result.samples)
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)


DILOCO = register(Protocol("diloco", "H inner steps, then outer Nesterov SGD on the mean "
                                     "pseudo-gradient", DilocoParams, DilocoServer,
                           DilocoWorker))
