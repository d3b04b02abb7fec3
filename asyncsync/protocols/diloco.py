"""DiLoCo: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient.

Worker: starting from the global model ``w``, run H local (inner) SGD steps and push its
progress ``d_i = w_i - w``; pull the next global model and adopt it. Server: when the
deltas of every live worker are in, the pseudo-gradient is ``g = -mean_i d_i`` and the
outer optimizer steps the parameters on it, ``w <- w - outer.update(w, g)``: SGD with
Nesterov momentum (lr 0.7, momentum 0.9) by default; buffers (BatchNorm statistics) take
no outer step, they become the workers' mean, ``w + mean_i d_i``. Then version += 1 and
the pulls are released. Outer momentum 0 gives plain outer SGD (lr 1 is then local SGD's
averaging). The inner optimizer is the worker's local SGD (the paper uses AdamW).

The outer step is the SDK's server optimizer seam (`asyncsync.protocols.server_optim`),
the one FedOpt's optimizers plug into: ``outer_optimizer = "adam"`` (or yogi, adagrad)
takes an adaptive outer step at ``outer_lr`` with ``beta1``, ``beta2``, ``tau`` (the paper
also tries Adam as outer optimizer). ``outer_lr`` defaults to the paper's 0.7 with sgd and
to FedOpt's server rate, 1e-2, with the adaptive ones, whose step is about ``outer_lr`` per
parameter whatever the delta's size (at 0.7 they diverge on small models).

The barrier is the SDK's `RoundServer` (per fragment: Streaming DiLoCo splits the model);
a lost worker's delta of an open round counts if it arrived before it left (else the
round closes with the others'), and a rejoined worker takes part in the open round from
the model it joined with (a delta of it that the round held is replaced by its new one).
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
    Protocol,
    WorkerLoop,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import Cutoff, RoundServer
from asyncsync.protocols.server_optim import (
    ADAPTIVE_LR,
    SERVER_OPTIMIZERS,
    AdaptiveOptions,
    ServerOptimizer,
    ServerSgd,
    apply_delta,
)

_MOMENTUM = 0.9
"""The paper's outer Nesterov momentum (the default of `outer_momentum`)."""
_OUTER_LR = 0.7
"""The paper's outer learning rate (`outer_lr`'s default with sgd)."""


@dataclass(frozen=True)
class DilocoParams(AdaptiveOptions, Cutoff):
    """Parameters of DiLoCo (with the adaptive outer optimizers' and the round policies)."""

    inner_steps: int = option(50, lambda v: v >= 1, "must be >= 1",
                              "H: local (inner) steps between outer steps")
    outer_lr: float | None = option(None, lambda v: v is None or v > 0, "must be > 0",
                                    f"outer learning rate (default: {_OUTER_LR} with sgd, "
                                    f"{ADAPTIVE_LR} with the adaptive ones)")
    outer_momentum: float = option(_MOMENTUM, lambda v: 0 <= v < 1, "must be in [0, 1)",
                                   "outer Nesterov momentum (0: plain outer SGD)")
    outer_optimizer: str = option("sgd", lambda v: v in SERVER_OPTIMIZERS,
                                  f"must be one of {', '.join(SERVER_OPTIMIZERS)}",
                                  "sgd (Nesterov, outer_momentum) | adam | yogi | adagrad")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_cutoff()
        self.check_unused("outer_optimizer", self.outer_optimizer)
        if self.outer_optimizer != "sgd" and self.outer_momentum != _MOMENTUM:
            raise ValueError(f"outer_momentum: not used by the {self.outer_optimizer!r} "
                             f"optimizer (outer_optimizer is {self.outer_optimizer!r}: its "
                             "momentum is beta1); leave this key out")

    def make_outer_optimizer(self) -> ServerOptimizer:
        """A fresh outer optimizer as configured."""
        if self.outer_optimizer == "sgd":
            return ServerSgd(_OUTER_LR if self.outer_lr is None else self.outer_lr,
                             self.outer_momentum, nesterov=self.outer_momentum > 0)
        lr = ADAPTIVE_LR if self.outer_lr is None else self.outer_lr
        return self.adaptive_optimizer(self.outer_optimizer, lr)


class DilocoServer(RoundServer):
    """The outer step on the negated mean delta of the parameters, with one outer optimizer
    per fragment; buffers become the workers' mean. The outer optimizers' states (e.g. the
    Nesterov momentum) are the rule's checkpoint state."""

    push_kinds = frozenset({"delta"})

    def __init__(self, params: DilocoParams, store: Store) -> None:
        super().__init__(params, store)
        self.outer = [params.make_outer_optimizer() for _ in self.bounds]

    def parameter_count(self, fragment: int) -> int:
        """How many leading elements of the fragment are parameters (the rest: buffers)."""
        start, stop = self.bounds[fragment]
        return min(max(self.store.num_params - start, 0), stop - start)

    def combine(self, fragment: int, current: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return apply_delta(self.outer[fragment], current, mean, self.parameter_count(fragment))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Each fragment's outer optimizer state, under ``outer.<fragment>.`` (e.g.
        ``outer.0.momentum``)."""
        return {f"outer.{fragment}.{key}": value
                for fragment, outer in enumerate(self.outer)
                for key, value in outer.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for fragment, outer in enumerate(self.outer):
            prefix = f"outer.{fragment}."
            try:
                outer.load_state_dict({key.removeprefix(prefix): value
                                       for key, value in state.items()
                                       if key.startswith(prefix)},
                                      self.parameter_count(fragment))
            except ValueError as exc:
                raise ValueError(f"outer optimizer of fragment {fragment}: {exc}") from None


class DilocoWorker(WorkerLoop[DilocoParams]):
    """H inner steps, push ``w_i - w``, adopt the new global model."""

    async def run(self, ctx: Context) -> None:
        steps = self.params.inner_steps
        anchor = await ctx.snapshot()
        while True:
            result = await ctx.steps(steps)
            delta = await ctx.delta_since(anchor)
            del anchor  # not held while the worker waits for the next global model
            exchange = ctx.push_and_pull("delta", delta, steps=steps, samples=result.samples)
            del delta  # the request holds it only until it is sent
            anchor, version, _ = await exchange
            await ctx.adopt(anchor, version)


DILOCO = register(Protocol("diloco", "H inner steps, then outer Nesterov SGD on the mean "
                                     "pseudo-gradient", DilocoParams, DilocoServer,
                           DilocoWorker))
