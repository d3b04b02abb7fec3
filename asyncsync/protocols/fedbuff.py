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
workers of equal speed and s = 1, every version averages one delta of each worker, all
from the previous version: synchronous delta averaging (local SGD).

Reference: J. Nguyen, K. Malik, H. Zhan, A. Yousefpour, M. Rabbat, M. Malek, D. Huba,
"Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncsync.protocols.base import Protocol, Push, ServerRule, option, register
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdWorker
from asyncsync.protocols.ports import Contributions, Store
from asyncsync.protocols.server_optim import ServerOptimizerState, apply_delta
from asyncsync.protocols.staleness import StalenessOptions


@dataclass(frozen=True)
class FedBuffParams(LocalSgdParams, StalenessOptions):
    """Parameters of FedBuff (local SGD's, the staleness function's, and K)."""

    buffer_size: int = option(3, lambda v: v >= 1, "must be >= 1",
                              "K: deltas aggregated into each version")


def accumulate(total: torch.Tensor | None, delta: torch.Tensor,
               weight: float) -> torch.Tensor:
    """``total + weight * delta`` (`delta` itself, scaled, when there is no total yet)."""
    return delta.mul_(weight) if total is None else total.add_(delta, alpha=weight)


class FedBuffServer(ServerOptimizerState, ServerRule):
    """Buffer staleness-weighted deltas; every K-th arrival makes a version.

    Attributes:
        total: the weighted sum of the buffered deltas (None when the buffer is empty).
        buffered: ``(worker, base_version)`` of each buffered delta, in arrival order.
        optimizer: the server optimizer.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: FedBuffParams, store: Store) -> None:
        super().__init__(params, store)
        self.optimizer = params.make_server_optimizer()
        self.total: torch.Tensor | None = None
        self.buffered: Contributions = []

    async def on_push(self, push: Push) -> dict[str, Any]:
        async with self.store.lock:
            weight = self.params.staleness_weight(self.store.version - push.base_version)
            total = await self.store.compute(accumulate, self.total, push.vector, weight)
            self.total = total
            self.buffered.append((push.worker, push.base_version))
            if len(self.buffered) == self.params.buffer_size:
                await self._flush(total)
        return {"staleness_weight": weight, "buffered": len(self.buffered)}

    async def _flush(self, total: torch.Tensor) -> None:
        """Commit the buffer as one version and empty it (also when the store refuses the
        result as non-finite: the buffer is then discarded and the push refused)."""
        def step() -> torch.Tensor:
            return apply_delta(self.optimizer, self.store.w, total.div_(len(self.buffered)),
                               self.store.num_params)

        try:
            self.store.commit(await self.store.compute(step), self.buffered)
        finally:
            self.total, self.buffered = None, []


class FedBuffWorker(LocalSgdWorker):
    """Local SGD's loop with a separate pull after each push: the pull then comes a round
    trip later, so with equal speeds it sees the other workers' pushes of the same round
    (with K = N, synchronous averaging); a fused exchange would pull before they land."""

    fused = False


FEDBUFF = register(Protocol("fedbuff", "buffered asynchronous aggregation: every K "
                                       "staleness-weighted deltas make a version",
                            FedBuffParams, FedBuffServer, FedBuffWorker))
