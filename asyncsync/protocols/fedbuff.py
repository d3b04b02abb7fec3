"""FedBuff: buffered asynchronous aggregation of staleness-weighted deltas.

Worker: pull ``(w, t)``, run H local SGD steps from it, push the delta
``x - w`` with its base version ``tau = t``, repeat; it never waits for anyone. Server, on
arrival of each delta: weight it by ``s(t_now - tau)`` (the SDK's staleness functions, as
FedAsync's) and add it to a buffer; when the buffer holds K deltas,
``w <- w + eta_g * sum_k s(d_k) delta_k / K`` as one version, and the buffer empties. The
step is the server optimizer's (`asyncsync.protocols.server_optim`) on the pseudo-gradient
``-sum / K``: sgd at ``server_lr`` = eta_g (1 by default) is the rule above, and FedAdam,
FedYogi or FedAdagrad may replace it. Buffers (BatchNorm statistics) become
``w + sum / K``. The push reply's meta carries the applied weight (``staleness_weight``)
and how many deltas the buffer now holds (``buffered``; 0 when this push flushed it).

The buffer holds ``sum / K`` itself, added to share by share (each delta scaled by
``s / K`` before it is added, as `rounds.average` does), so finite deltas never overflow
on the way to a finite mean. A flush whose result the server optimizer or the store
refuses as non-finite discards the buffer, as a round protocol discards a round: the
model and the optimizer's state stay as they were, no version is made, the push that
completed the buffer is answered (not refused; its reply says ``refused: True``) and
`refused` counts it.

Choices where the paper is open (it assumes many clients sampled by the server):

- **(choice)** A fast worker may contribute several deltas to one version: the buffer
  counts deltas, not workers, so nobody waits for a straggler.
- **(choice)** The staleness of a delta is taken when it arrives; versions change only
  when the buffer flushes, so it is the staleness at which it is applied.
- **(choice)** Membership: nobody waits for anybody, so a lost worker just stops
  contributing (its deltas already in the buffer stay, as accepted updates) and a rejoined
  one starts from the current model. A checkpoint keeps the server optimizer's state,
  not the partly filled buffer.

Local steps may take FedProx's proximal term (``mu``), as local SGD's do. With K = N
and s = 1, a version averages one delta of each worker, all from the previous version
(synchronous delta averaging, local SGD), exactly when every worker's pull after its
push is answered only after the other N - 1 deltas of that round arrived. Nothing makes a
pull wait for them: it holds when the workers' steps take equal time and their messages
equal time too (virtual time with equal step costs and links), not over real HTTP, where
a worker whose exchange with the server is quicker may pull, train and push again from
the same version before a slower worker's delta of that version lands; its two deltas
then make one version, and FedBuff is asynchronous, as intended.

Reference: J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba,
"Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from asyncsync.protocols.base import (
    Protocol,
    Push,
    ServerRule,
    Unacceptable,
    check_fields,
    option,
    register,
    unchanged_if_refused,
)
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdWorker
from asyncsync.protocols.ports import Contributions, Store
from asyncsync.protocols.rounds import CUTOFF_OPTIONS
from asyncsync.protocols.server_optim import ServerOptimizerState, apply_delta
from asyncsync.protocols.staleness import StalenessOptions


@dataclass(frozen=True)
class FedBuffParams(LocalSgdParams, StalenessOptions):
    """Parameters of FedBuff (local SGD's, the staleness function's, and K)."""

    REFUSED_OPTIONS: ClassVar[frozenset[str]] = CUTOFF_OPTIONS

    buffer_size: int = option(3, lambda v: v >= 1, "must be >= 1",
                              "K: deltas aggregated into each version")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_server_optimizer()
        self.check_staleness()
        self.refuse_cutoff("fedbuff", "it has no rounds: every K deltas make a version, "
                           "whenever they come")


def accumulate(total: torch.Tensor | None, delta: torch.Tensor,
               share: float) -> torch.Tensor:
    """``total + share * delta`` (`delta` itself, scaled, when there is no total yet)."""
    return delta.mul_(share) if total is None else total.add_(delta, alpha=share)


class FedBuffServer(ServerOptimizerState, ServerRule):
    """Buffer staleness-weighted deltas; every K-th arrival makes a version.

    Attributes:
        total: ``sum / K`` over the buffered deltas (None when the buffer is empty).
        buffered: ``(worker, base_version)`` of each buffered delta, in arrival order.
        optimizer: the server optimizer.
        refused: flushes whose result was refused as non-finite (their buffer discarded).
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: FedBuffParams, store: Store) -> None:
        super().__init__(params, store)
        self.optimizer = params.make_server_optimizer()
        self.total: torch.Tensor | None = None
        self.buffered: Contributions = []
        self.refused = 0

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            weight = self.params.staleness_weight(self.store.version - push.base_version)
            share = weight / self.params.buffer_size
            total = await self.store.compute(accumulate, self.total, push.vector, share)
            self.total = total
            self.buffered.append((push.worker, push.base_version))
            meta: dict[str, Any] = {"staleness_weight": weight}
            if len(self.buffered) == self.params.buffer_size:
                meta["refused"] = not await self._flush(total)
            meta["buffered"] = len(self.buffered)
        return meta

    async def _flush(self, mean: torch.Tensor) -> bool:
        """Commit the buffer (`mean`: ``sum / K``) as one version and empty it; whether it
        was committed (a result refused as non-finite discards the buffer, unchanged)."""
        def step() -> torch.Tensor:
            return apply_delta(self.optimizer, self.store.w, mean, self.store.num_params)

        buffered, self.total, self.buffered = self.buffered, None, []
        try:
            with unchanged_if_refused(self):
                self.store.commit(await self.store.compute(step), buffered)
        except Unacceptable:
            self.refused += 1
            return False
        return True


class FedBuffWorker(LocalSgdWorker):
    """Local SGD's loop with a separate pull after each push: the pull then comes a round
    trip later, so with equal speeds it sees the other workers' pushes of the same round
    (with K = N, synchronous averaging); a fused exchange would pull before they land."""

    fused = False


FEDBUFF = register(Protocol("fedbuff", "buffered asynchronous aggregation: every K "
                                       "staleness-weighted deltas make a version",
                            FedBuffParams, FedBuffServer, FedBuffWorker))
