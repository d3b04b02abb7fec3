"""SCAFFOLD: local steps corrected by control variates, against client drift.

Worker i keeps a control variate ``c_i``. Each round it pulls the global model ``x`` and
the server's control variate ``c``, runs K local steps on the corrected gradient
``y <- y - eta (g_i(y) - c_i + c)`` (the SDK's `correction`), then sets
``c_i+ = c_i - c + (x - y) / (K eta)`` (the paper's option II: for plain local SGD, the
mean of the uncorrected gradients along its path) and pushes both ``c_i+`` and the model
delta ``y - x``. Server: when every live worker of the round has pushed both, the server
optimizer (`asyncsync.protocols.server_optim`) steps the parameters on the negated mean
delta (sgd at ``server_lr`` = eta_g, 1 by default: ``x <- x + eta_g mean_i (y_i - x)``;
buffers take the mean), ``c <- mean_i c_i+``, version += 1.

Wire cost: twice local SGD's in each direction. A round moves the delta and ``c_i+`` up
(two model-sized pushes, the control variate first) and ``x`` and ``c`` down (two pulls).

Choices where the paper is open or does not fit:

- **(choice)** Every live worker takes part in every round (no client sampling); rounds
  and membership are local SGD's (`asyncsync.protocols.local_sgd`).
- **(choice)** A worker pushes its new control variate ``c_i+`` rather than
  ``delta c_i = c_i+ - c_i`` (same size); the server keeps each live worker's latest
  ``c_i`` and sets ``c`` to their mean, the paper's invariant ``c = (1/N) sum_i c_i``.
  With every worker in every round this is the round's mean ``c_i+``, the paper's
  ``c + (1/N) sum_i delta c_i``; when a round closes without some members (backup
  workers, deadlines), their latest ``c_i`` stay in the mean, and a late member's
  ``c_i+`` replaces its previous one though its delta is dropped, so that ``c`` does not
  lean toward the workers that arrive in time (the bias SCAFFOLD removes). A lost
  worker's ``c_i`` leaves the mean with it, but a delta of it that arrived before it
  left counts, with its ``c_i+``, in its round; a rejoined one's counts from its next
  push.
  The latest ``c_i`` cost the server one model-sized vector per live worker; they are
  not checkpointed (a resumed server's ``c`` is rebuilt from the next rounds' pushes).
- **(choice)** A worker whose loop (re)starts takes ``c_i = c``: its first round runs
  uncorrected local SGD, as every worker's first round does in the paper (``c = c_i = 0``).
- **(choice)** Control variates are full-length vectors, but only their parameter slots
  are used (buffers take no gradient steps). Option II assumes plain local SGD; with local
  momentum, ``(x - y) / (K eta)`` is the mean step direction instead.

Reference: S. P. Karimireddy, S. Kale, M. Mohri, S. J. Reddi, S. U. Stich, A. T. Suresh,
"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import (
    BadRequest,
    CheckpointError,
    OutOfStep,
    Protocol,
    Pull,
    Push,
    Reply,
    WorkerLoop,
    brief,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.local_sgd import LocalSgdServer
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import Cutoff, average
from asyncsync.protocols.server_optim import ServerOptimizerOptions

PARTS = ("model", "control")
"""What a pull fetches (``meta["part"]``): the global model (default) or ``c``."""


@dataclass(frozen=True)
class ScaffoldParams(ServerOptimizerOptions, Cutoff):
    """Parameters of SCAFFOLD (with the server optimizer's and the round policies)."""

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "K: local steps per round")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_cutoff()
        self.check_server_optimizer()


class ScaffoldServer(LocalSgdServer):
    """Local SGD's rounds, with the server's control variate ``c`` beside the model.

    A worker's control variate push (kind ``control``) must come before its delta in each
    round; a lost worker's is withdrawn, unless its delta arrived. ``c`` and the server
    optimizer's
    state are the rule's checkpoint state.

    Attributes:
        control: the server's control variate ``c``.
        controls: the control variates pushed for the open round, by worker.
        latest: each live worker's latest control variate ``c_i`` (its round's or late).
    """

    push_kinds = frozenset({"delta", "control"})

    def __init__(self, params: ScaffoldParams, store: Store) -> None:
        super().__init__(params, store)
        self.control = torch.zeros_like(store.w)
        self.controls: dict[int, torch.Tensor] = {}
        self.latest: dict[int, torch.Tensor] = {}

    async def on_push(self, push: Push) -> dict[str, Any]:
        if push.kind == "delta":
            return await super().on_push(push)
        async with self.store.lock:
            if push.base_version < self.store.version and self.cutoff.cuts:
                self.latest[push.worker] = push.vector  # its delta is counted late
                return {"part": "control", "late": True}
            if push.base_version != self.store.version:
                raise OutOfStep(f"control variate based on version {push.base_version}, but "
                                f"the round in progress is at version {self.store.version}")
            if not self.is_member(push.worker) or push.worker in self.pending[0]:
                raise OutOfStep(f"worker {push.worker} has no control variate to push in "
                                "the round in progress")
            self.controls[push.worker] = push.vector
        return {"part": "control"}

    def take(self, push: Push) -> None:
        if push.worker not in self.controls:
            raise OutOfStep(f"worker {push.worker} pushed its delta before its control "
                            "variate")
        super().take(push)

    def left(self, worker: int) -> None:
        if worker not in self.pending[0]:  # (an arrived delta counts with its c_i+)
            self.controls.pop(worker, None)
        self.latest.pop(worker, None)
        super().left(worker)

    def joined(self, worker: int) -> None:
        self.controls.pop(worker, None)
        self.latest.pop(worker, None)
        super().joined(worker)

    def aggregate(self, w: torch.Tensor, pushes: list[Push]) -> torch.Tensor:
        """Local SGD's server step; ``c`` becomes the mean of the live workers' latest
        control variates: the round's, then those of the workers it closed without."""
        self.latest.update(self.controls)  # with those of members whose delta is late
        self.controls.clear()
        arrived = {push.worker for push in pushes}
        self.control = average([self.latest[push.worker] for push in pushes]
                               + [control for worker, control in self.latest.items()
                                  if worker not in arrived and worker in self.store.live])
        for gone in arrived - self.store.live:  # (its delta counted; it left meanwhile)
            del self.latest[gone]
        return super().aggregate(w, pushes)

    async def on_pull(self, pull: Pull) -> Reply:
        part = pull.meta.get("part", "model")
        if part not in PARTS:
            raise BadRequest(f"unknown part {brief(part)}: pull one of {', '.join(PARTS)}")
        if part == "model":
            return await super().on_pull(pull)
        return Reply(meta={"part": "control"}, vector=self.control, version=self.store.version)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The server optimizer's state and ``c`` (``control``)."""
        return {**super().state_dict(), "control": self.control}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        control = state.get("control")
        if control is not None:
            if control.shape != self.control.shape:
                raise CheckpointError(f"control has shape {tuple(control.shape)}, expected "
                                      f"{tuple(self.control.shape)}")
            self.control = control.clone()


def next_control(own: torch.Tensor, server: torch.Tensor, delta: torch.Tensor,
                 steps_lr: float) -> torch.Tensor:
    """Option II: ``c_i+ = c_i - c + (x - y) / (K eta)``, with ``delta = y - x``."""
    return own - server - delta / steps_lr


class ScaffoldWorker(WorkerLoop):
    """Pull ``x`` and ``c``, K corrected local steps, push ``c_i+``, then the delta."""

    async def run(self, ctx: Context) -> None:
        steps = self.params.local_steps
        own: torch.Tensor | None = None
        while True:
            anchor, version, _ = await ctx.pull()
            await ctx.adopt(anchor, version)
            server, _, _ = await ctx.pull({"part": "control"})
            own = server if own is None else own
            correction = await ctx.compute(torch.sub, server, own)
            result = await ctx.steps(steps, correction=correction)
            delta = await ctx.delta_since(anchor)
            del anchor, correction  # used: not held while the worker waits for its next round
            own = await ctx.compute(next_control, own, server, delta, steps * ctx.lr)
            del server  # ``own`` (c_i) is the state this loop keeps across rounds
            await ctx.push("control", own, steps=steps, samples=result.samples)
            await ctx.push("delta", delta, steps=steps, samples=result.samples)
            del delta


SCAFFOLD = register(Protocol("scaffold", "controlled averaging: local steps corrected by "
                                         "control variates (c - c_i) against client drift",
                             ScaffoldParams, ScaffoldServer, ScaffoldWorker))
