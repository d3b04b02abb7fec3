"""DC-ASGD: asynchronous SGD with delay compensation.

Worker: as in ASP, pull the current model, compute a gradient g there, push it. Server: the
gradient was computed at the model ``w_pulled`` of its base version, but lands on the
current model ``w``; it is compensated with a diagonal approximation of the Hessian
(``lambda g * g``, elementwise) times the drift since the pull,

    ``g_c = g + lambda * g * g * (w - w_pulled)``,

then ``w <- opt_step(w, g_c)``, version += 1. A gradient of staleness 0 is unchanged, and
lambda = 0 is ASP.

Choices where the paper is open:

- **(choice)** Constant lambda (the paper's DC-ASGD-c; default 0.04); the adaptive
  DC-ASGD-a (lambda scaled by a running mean square of the gradients) is not offered.
- **(choice)** ``w_pulled`` comes from a ring of the models the server handed out by pulls
  during the last `ring` versions (at most `ring` models): references to the store's old
  vectors, which a commit replaces and never changes, so keeping one costs no copy, and
  memory is bounded by `ring` models whatever the number of workers (never one copy per
  worker).
- **(choice)** A gradient whose base version has left the ring (staleness >= `ring`, or a
  model the worker did not get from a pull, e.g. at its join) is applied uncompensated, as
  plain ASP, and counted in `uncompensated`; the push reply's meta says
  ``compensated: False``. Refusing it instead would make the worker rejoin and restart
  (that is what an out-of-step refusal means), and a worker slower than the ring spans
  would loop through rejoins without ever contributing. ``ring`` is at least 2: a ring of
  one version would compensate nothing (staleness 0 needs no compensation). With N
  workers of equal speed the staleness is about N - 1, so ``ring`` should exceed the
  run's size: the server logs a warning naming ``ring`` at the 1st, 10th, 100th, ...
  uncompensated gradient, since a run whose gradients all outlive the ring is plain ASP.
- Buffer slots (e.g. BatchNorm statistics) carry values, not gradients: they replace the
  global ones as in ASP, uncompensated.

Membership as in ASP: nobody waits, so a lost worker just stops contributing and a
rejoined one pulls and goes on (the engine refuses its pushes from before the rejoin).

Reference: S. Zheng, Q. Meng, T. Wang, W. Chen, N. Yu, Z.-M. Ma, T.-Y. Liu, "Asynchronous
Stochastic Gradient Descent with Delay Compensation", ICML 2017.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.asp import AspWorker
from asyncsync.protocols.base import (
    Protocol,
    Pull,
    Push,
    Reply,
    ServerRule,
    check_fields,
    no_round_policies,
    option,
    register,
)
from asyncsync.protocols.ports import Store

LOG = logging.getLogger(__name__)

@dataclass(frozen=True)
class DcasgdParams:
    """Parameters of DC-ASGD."""

    NOT_OFFERED = no_round_policies(
        "dcasgd", "it has no rounds: each gradient is applied on arrival, delay-compensated")

    lam: float = option(0.04, lambda v: 0 <= v < math.inf, "must be >= 0 and finite",
                        "lambda: weight of the delay compensation g * g * (w - w_pulled)")
    ring: int = option(16, lambda v: v >= 2,
                       "must be >= 2 (a ring of 1 keeps only the current version: no stale "
                       "gradient could be compensated)",
                       "pulled models kept: the last `ring` versions (older: uncompensated)")

    def __post_init__(self) -> None:
        check_fields(self)


def compensate(gradient: torch.Tensor, w: torch.Tensor, pulled: torch.Tensor, lam: float,
               num_params: int) -> torch.Tensor:
    """``g + lam * g * g * (w - pulled)`` on the parameter slots, in place in `gradient`.

    Multiplied as ``g * (g * (w - pulled))``, so a slot that did not move adds exactly 0
    (never ``inf * 0``) however large its gradient.
    """
    g = gradient[:num_params]
    g.add_(g * (g * (w[:num_params] - pulled[:num_params])), alpha=lam)
    return gradient


class DcasgdServer(ServerRule):
    """Compensate each gradient for the drift since its pull, then apply it on arrival.

    Attributes:
        pulled: the ring: version -> the model pulls handed out at that version (the last
            `ring` versions only).
        uncompensated: gradients applied uncompensated (their base version had left the
            ring).
    """

    push_kinds = frozenset({"gradient"})

    def __init__(self, params: DcasgdParams, store: Store) -> None:
        super().__init__(params, store)
        self.pulled: dict[int, torch.Tensor] = {}
        self.uncompensated = 0

    def _uncompensated(self, staleness: int) -> None:
        """Count a gradient applied uncompensated; warn at the 1st, 10th, 100th, ..."""
        self.uncompensated += 1
        if math.log10(self.uncompensated).is_integer():
            LOG.warning("dcasgd applied %d gradients uncompensated (the latest of staleness "
                        "%d): their pulled model had left the ring of the last %d versions; "
                        "raise ring above the run's staleness (about the number of workers)",
                        self.uncompensated, staleness, self.params.ring)

    def _forget_old(self) -> None:
        """Drop the ring's models older than the last `ring` versions."""
        oldest = self.store.version - self.params.ring
        while self.pulled and next(iter(self.pulled)) <= oldest:
            del self.pulled[next(iter(self.pulled))]

    async def on_pull(self, pull: Pull) -> Reply:
        reply = self.store.current()
        assert reply.vector is not None and reply.version is not None
        self.pulled.setdefault(reply.version, reply.vector)
        return reply

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            pulled = self.pulled.get(push.base_version)
            gradient = push.vector
            if pulled is None:
                self._uncompensated(self.store.version - push.base_version)
            elif push.base_version != self.store.version:  # staleness 0: nothing to add
                gradient = await self.store.compute(compensate, gradient, self.store.w, pulled,
                                                    self.params.lam, self.store.num_params)
            await self.store.apply_gradient(gradient, [(push.worker, push.base_version)])
            self._forget_old()
        return {"compensated": pulled is not None}


DCASGD = register(Protocol("dcasgd", "asynchronous SGD with delay compensation: "
                                     "g + lambda g*g*(w - w_pulled) applied on arrival",
                           DcasgdParams, DcasgdServer, AspWorker))
