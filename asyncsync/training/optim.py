"""SGD on flat vectors, shared by workers (local steps) and the server (global steps)."""

from __future__ import annotations

import math

import torch


class FlatSGD:
    """SGD with optional momentum, Nesterov and weight decay on one flat vector.

    `update(w, g)` returns the step `u` such that the new vector is ``w - u``; the caller
    applies it in place (a worker's own parameters) or out of place (the server's global
    vector, whose old version may still be streaming to a reader).
    """

    def __init__(
        self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False
    ) -> None:
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("nesterov needs momentum > 0")
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.momentum_buffer: torch.Tensor | None = None
        """The momentum state (None before the first step or without momentum)."""

    def update(self, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The step for gradient `g` at point `w` (momentum state advances)."""
        step, self.momentum_buffer = self.propose(w, g)
        return step

    def propose(self, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor,
                                                                 torch.Tensor | None]:
        """The step for `g` at `w` and the momentum state it would leave, without changing
        this optimizer (the server checks both before it adopts them)."""
        if self.weight_decay:
            g = g + self.weight_decay * w
        buffer = self.momentum_buffer
        if self.momentum:
            buffer = g.clone() if buffer is None else buffer * self.momentum + g
            g = g + self.momentum * buffer if self.nesterov else buffer
        return self.lr * g, buffer

    def apply_into(self, out: torch.Tensor, w: torch.Tensor, g: torch.Tensor
                   ) -> torch.Tensor | None:
        """Write ``w - step`` for gradient `g` into `out`, without changing this optimizer;
        returns the momentum state it would leave (as `propose`). Plain SGD takes one pass
        and no temporary vector."""
        if not self.momentum and not self.weight_decay:
            torch.add(w, g, alpha=-self.lr, out=out)
            return None
        step, buffer = self.propose(w, g)
        torch.sub(w, step, out=out)
        return buffer
