"""Local SGD: periodic model averaging after H local steps; FedProx and FedOpt as options.

Worker: wait until the server has a round for it, adopt the round's model ``w``, run H
local SGD steps, push the delta ``w_i(end) - w_i(start)`` with its sample count. With
``mu > 0`` the local steps minimize FedProx's ``F_i(x) + mu/2 ||x - w||^2`` (the SDK's
proximal steps, which FedAsync's rho uses too). Server: when every live participant of the
round has pushed, ``delta = sum_i p_i delta_i`` over the round's deltas with equal weights
``p_i = 1/n`` (n: the deltas of the round), and the server optimizer
(`asyncsync.protocols.server_optim`) steps the parameters on the pseudo-gradient
``-delta``: by default sgd at lr 1, ``w <- w + delta``; FedAdam, FedYogi or FedAdagrad with
``server_optimizer``. Buffers (BatchNorm statistics) become ``w + delta``. Then version
+= 1, and the next round opens.

A round is identified by the version its participants start from. The hooks
`LocalSgdServer.participants` (who trains in a round), `LocalSgdServer.weight` (a delta's
unnormalised weight) and `LocalSgdServer.aggregate` (the next global vector from the
round's pushes) are what FedAvg, FedNova and SCAFFOLD override.

**(choice)** FedProx's other ingredient, taking partial work from stragglers (its
gamma-inexact local solutions), is left out: every participant runs its H steps (FedNova
is the protocol for unequal local work).

References: S. U. Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019;
T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization
in Heterogeneous Networks" (FedProx), MLSys 2020.
"""

from __future__ import annotations

from collections.abc import Collection, Set
from dataclasses import dataclass
from typing import ClassVar

import torch
from typing_extensions import TypeVar

from asyncsync.protocols.base import (
    Protocol,
    Pull,
    Push,
    Reply,
    WorkerLoop,
    check_fields,
    option,
    register,
)
from asyncsync.protocols.ports import Context, Store
from asyncsync.protocols.rounds import Cutoff, RoundServer, average, contributions
from asyncsync.protocols.server_optim import (
    ServerOptimizerOptions,
    ServerOptimizerState,
    apply_delta,
)


@dataclass(frozen=True)
class LocalSgdParams(ServerOptimizerOptions, Cutoff):
    """Parameters of local SGD (with FedProx's mu, the server optimizer's and the round
    policies of `Cutoff`)."""

    local_steps: int = option(8, lambda v: v >= 1, "must be >= 1",
                              "H: local SGD steps per round")
    mu: float = option(0.0, lambda v: v >= 0, "must be >= 0",
                       "FedProx: weight of the proximal term mu/2 ||x - w||^2 (0: off)")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_cutoff()
        self.check_server_optimizer()


class LocalSgdServer(ServerOptimizerState, RoundServer):
    """One round per version: the last live participant's delta closes it.

    Each round's participants are drawn when it opens from the live workers; round 0
    opens when first asked for (a pull, a push, a leave or a rejoin, all after the run's
    start), so it is drawn from the workers live then, not from those that joined away
    (offline at the start). The round waits for those still live. A participant's delta
    that arrived counts though it then leaves; if no participant is left live and no
    delta arrived, the round is drawn again from the live workers. When a worker
    rejoins, the open round is drawn again from the live workers if that keeps every
    participant still live (always so when every live worker trains in every round, as in
    local SGD: the rejoined worker then joins the open round); otherwise the rejoined
    worker waits for a round that draws it.

    The server optimizer's state is the rule's checkpoint state.

    Attributes:
        round: the participants drawn for the open round.
        optimizer: the server optimizer.
    """

    push_kinds = frozenset({"delta"})

    def __init__(self, params: ServerOptimizerOptions, store: Store) -> None:
        super().__init__(params, store)
        self.optimizer = params.make_server_optimizer()
        self._round: frozenset[int] | None = None  # (round 0: drawn when it opens)

    @property
    def round(self) -> frozenset[int]:
        """The participants of the open round (round 0 drawn at the first asking)."""
        if self._round is None:
            self._round = self.participants(self.store.version, self.store.live)
        return self._round

    @round.setter
    def round(self, drawn: frozenset[int]) -> None:
        self._round = drawn

    def participants(self, version: int, candidates: Collection[int]) -> frozenset[int]:
        """The workers, among `candidates`, that train in the round starting from `version`:
        all of them."""
        return frozenset(candidates)

    def members(self, fragment: int = 0) -> Set[int]:
        return self.round & self.store.live

    def is_member(self, worker: int) -> bool:
        """Whether `worker` is in `members` (without building the set: the held pulls of a
        population's idle workers ask at every commit)."""
        return worker in self.round and worker in self.store.live

    def take(self, push: Push) -> None:
        self.weight(push)  # refuse a delta that cannot be weighted

    def left(self, worker: int) -> None:
        if not self.members() and not self.pending[0]:
            self.round = self.participants(self.store.version, self.store.live)

    def joined(self, worker: int) -> None:
        members = self.members()  # (draws round 0 if it is not drawn yet)
        wanted = self.wanted  # (a draw sets it; this one may not be taken)
        drawn = self.participants(self.store.version, self.store.live)
        if worker not in self.round and members <= drawn:
            self.round = drawn
        else:
            self.wanted = wanted

    def aggregate(self, w: torch.Tensor, pushes: list[Push]) -> torch.Tensor:
        """The next global vector from the round's pushes (in the compute seam): the server
        step on their weighted mean delta."""
        mean = average([push.vector for push in pushes], [self.weight(push) for push in pushes])
        return apply_delta(self.optimizer, w, mean, self.store.num_params)

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        """Commit the round's `aggregate`, then draw the next one's participants."""
        new = await self.store.compute(self.aggregate, self.store.w, list(pushes.values()))
        self.store.commit(new, contributions(pushes))
        self.round = self.participants(self.store.version, self.store.live)

    async def on_pull(self, pull: Pull) -> Reply:
        """Answer once the open round counts on the worker and it has not pushed yet."""
        def has_work() -> bool:
            return self.is_member(pull.worker) and pull.worker not in self.pending[0]

        await self.store.wait_for(has_work, pull.worker)
        return self.store.current()


LP = TypeVar("LP", bound=LocalSgdParams, default=LocalSgdParams)
"""The parameters of a local SGD worker (a subclass's own, e.g. FedAvg's)."""


class LocalSgdWorker(WorkerLoop[LP]):
    """Pull a round's model, run H local (proximal) steps, push the delta and pull the next
    round's model (one exchange)."""

    fused: ClassVar[bool] = True
    """Push and pull in one request (the pull waits for the round anyway). An asynchronous
    variant whose pull should see the pushes that arrive in the meantime sets False."""

    def plan(self, ctx: Context) -> list[tuple[int, int]]:
        """A round's local steps as runs of ``(steps, batch size)``: H steps of the default
        batch (FedAvg's epochs plan otherwise)."""
        return [(self.params.local_steps, ctx.batch_size)]

    async def run(self, ctx: Context) -> None:
        plan, mu = self.plan(ctx), self.params.mu
        steps = sum(count for count, _ in plan)
        anchor, version, _ = await ctx.pull()
        while True:
            await ctx.adopt(anchor, version)
            proximal = (anchor, mu) if mu > 0 else None
            samples = 0
            for count, size in plan:
                samples += (await ctx.steps(count, size, proximal=proximal)).samples
            delta = await ctx.delta_since(anchor)
            del anchor, proximal  # adopted: not held while the worker waits for its next round
            if self.fused:
                exchange = ctx.push_and_pull("delta", delta, steps=steps, samples=samples)
                del delta  # the request holds it only until it is sent
                anchor, version, _ = await exchange
            else:
                await ctx.push("delta", delta, steps=steps, samples=samples)
                del delta
                anchor, version, _ = await ctx.pull()


LOCAL_SGD = register(Protocol("local_sgd", "local SGD: H local steps, then average the deltas",
                              LocalSgdParams, LocalSgdServer, LocalSgdWorker))
