"""FedAvg: federated averaging, local SGD weighted by samples with client sampling.

Local SGD (see `asyncsync.protocols.local_sgd`) with two changes, made by overriding its
server's hooks: a round's participants are ``m = max(1, round(C * n))`` of the n live
workers (**(choice)** ``round`` is Python's, halves to even: C n = 2.5 samples 2 and 3.5
samples 4), sampled without replacement (seeded by ``(seed, version)``, so a run is
reproducible), and the deltas are weighted by their sample counts,
``w <- w + sum_i (n_i / n) delta_i`` with ``n = sum_i n_i`` over the round's deltas. Workers
not sampled for a round stay idle until a round includes them. With C = 1 (the default)
every live worker trains in every round. Local SGD's options apply: FedProx's proximal
term (``mu``) and a server optimizer on the weighted mean delta (``server_optimizer``:
FedAdam, FedYogi, FedAdagrad; see `asyncsync.protocols.server_optim`), and the round
policies of `asyncsync.protocols.rounds.Cutoff`: backup workers count within the round's
m sampled workers (at most m - 1 of them, for the run's size); with ``overcommit = o`` a
round draws ``ceil(m (1 + o))`` workers and closes with the first m deltas
(over-selection, as in Bonawitz et al., MLSys 2019; when m is every live worker, none is
left to draw, and a round closes with its first ``ceil(m / (1 + o))``, as local SGD's);
deadlines, fixed or adaptive, close it with what arrived.

Membership is local SGD's: round 0 is drawn when it opens, from the workers in the run
then (not those offline at the start); a participant's delta that arrived counts though
it then leaves, one in progress is lost and the round closes with the others' (it is
drawn again if no participant is left and no delta arrived); a rejoined worker joins
the open round when C = 1, otherwise it waits until a round samples it. A resumed server
(``--resume``: no start barrier), or a fresh one whose workers were all offline at the
start (all joined away), draws its first round at the first rejoin and, until a
report arrives, tops it up at each rejoin to k of the live workers (``ceil(k (1 + o))``
with over-selection), keeping its members, which may be training already (**(choice)**:
not drawn afresh, so the workers back early are likelier to be in it).

**Local epochs.** By default each participant runs H steps (``local_steps``) of the batch
B, so every delta carries the same ``H B`` samples and the weights are equal. With
``local_epochs = E`` it runs the paper's ClientUpdate instead: E epochs over its own shard
of ``n_k`` samples, ``E n_k`` samples in ``ceil(E n_k / B)`` steps (the paper's ``u_k``):
``E n_k // B`` steps of B and, when B does not divide ``E n_k``, one step of the rest.
Its delta carries ``samples = E n_k`` (what it processed), so the server weighs it by
``n_k / n``, and with unequal shards (a recipe's ``data.partition``, e.g.
``quantity_skew`` or ``dirichlet``) larger clients run more steps and count more. B is
the recipe's ``data.batch_size``; the shard is the worker's, drawn in reshuffled epochs
(`asyncsync.training.data.BatchSampler`), and a worker learns its size as
``Context.shard_size``. Batches that tell no size (the timing model's constant batches, a
cycled iterable) leave no epoch to count: a recipe check refuses ``local_epochs`` with
the timing model up front (`FedAvgParams.check_shards`), and a worker whose batch source
tells no size stops with an error naming ``local_epochs``.

When ``E n_k mod B == 1`` the short last step is of a single sample; a model with
BatchNorm layers cannot normalize one sample in training mode (the trainer's business:
the plan hands out the step as it is, see `FedAvgWorker.plan`).

- **(choice)** The last batch of a round is short, not dropped or filled from the next
  epoch (the paper takes B to divide ``n_k``): a round is exactly E epochs, and the
  weights are exactly ``n_k / n``. A worker's rounds begin where its sampler stands, so
  they stay aligned with its epochs unless a round is cut short (the worker went offline
  mid-round).
- **(choice)** ``local_epochs`` and ``local_steps`` exclude each other: a recipe that sets
  both (``local_steps`` other than its default) is refused, naming ``local_steps``.
- Larger shards take longer rounds, so a deadline or backup workers (`Cutoff`) drop the
  large clients' deltas more often than the small ones'; the weights are then the
  arrived deltas' ``n_k`` over their sum.

A recipe (unequal shards, half the clients a round, one epoch each):

```toml
name = "fedavg_epochs"
[defaults]
workers = 4
clock = "virtual"
[defaults.data]
partition = "quantity_skew"
batch_size = 200
[defaults.model]
name = "mlp"
options = { hidden = 16 }
[defaults.compute]
base_step_s = 0.01
[defaults.stop]
time_s = 3
[defaults.eval]
interval_s = 1
[[runs]]
name = "fedavg_e1"
protocol = { name = "fedavg", local_epochs = 1, fraction = 0.5 }
```

Reference: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas,
"Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass, fields

from asyncsync.protocols.base import Context, Protocol, Push, Unacceptable, option, register
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer, LocalSgdWorker
from asyncsync.protocols.ports import Store

_LOCAL_STEPS = next(f.default for f in fields(LocalSgdParams) if f.name == "local_steps")
"""H's default (a round's steps, unless `local_epochs` plans them)."""


@dataclass(frozen=True)
class FedAvgParams(LocalSgdParams):
    """Parameters of FedAvg (local SGD's, plus client sampling)."""

    fraction: float = option(1.0, lambda v: 0 < v <= 1, "must be in (0, 1]",
                             "C: fraction of the live workers sampled for each round")
    seed: int = option(0, help="seed of the client sampling")
    local_epochs: int = option(0, lambda v: v >= 0, "must be >= 0",
                               "E: local epochs over the worker's data shard per round, "
                               "ceil(E n_k / B) steps of the batch B, the last one short "
                               "(0: local_steps)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_epochs and self.local_steps != _LOCAL_STEPS:
            raise ValueError("local_steps: not used with local_epochs (a round is E epochs "
                             "over each worker's shard); leave one of the two keys out")

    def check_shards(self, known: bool) -> None:
        """Refuse ``local_epochs`` for a run whose workers' batches tell no shard size
        (`known` False: the timing model's constant batches), where no epoch can be
        counted; a recipe check calls it, as it calls `check_workers`."""
        if self.local_epochs and not known:
            raise ValueError("local_epochs: the run's batches tell no shard size (the "
                             "timing model draws no samples from a shard), so no epoch "
                             "can be counted; set local_steps instead, or train a model")

    def sampled(self, workers: int) -> int:
        """k = max(1, round(C n)): how many of `workers` live workers a round samples."""
        return min(workers, max(1, round(self.fraction * workers)))

    def check_workers(self, workers: int) -> None:
        """Also refuse backup workers that would leave none of a round's k sampled workers
        to wait for (the round would close with its first delta and drop the others)."""
        super().check_workers(workers)
        sampled = self.sampled(workers)
        if self.backup_workers and self.backup_workers >= sampled:
            raise ValueError(f"backup_workers: must be < the {sampled} workers a round samples "
                             f"(fraction {self.fraction:g} of {workers}), "
                             f"got {self.backup_workers}")


class FedAvgServer(LocalSgdServer):
    """Local SGD's rounds over a sampled fraction of the live workers, weighted by samples.

    A first round drawn at a rejoin (after a resume, or when every worker was offline at
    the start) is topped up as workers rejoin, until a report arrives (module docstring).
    """

    def __init__(self, params: FedAvgParams, store: Store) -> None:
        super().__init__(params, store)
        self._filling = False  # (topping up a first round drawn at a rejoin)

    def participants(self, version: int, candidates: Collection[int]) -> frozenset[int]:
        """``k = max(1, round(C * n))`` of the n `candidates`, drawn afresh for each round;
        with over-selection ``ceil(k (1 + overcommit))`` of them, of which the first k
        reports close the round. When k is every candidate (C = 1) none is left to
        over-select: the round closes, as local SGD's, with the first
        ``ceil(k / (1 + overcommit))`` reports of its k members."""
        pool = sorted(candidates)
        count = self.draws(len(pool))
        rng = random.Random(self.params.seed * 1_000_003 + version)
        return frozenset(rng.sample(pool, count))

    def joined(self, worker: int) -> None:
        """A first round drawn at the first rejoin (a resumed server's, or a fresh one's
        whose workers were all offline at the start) grows as the others rejoin until a
        report arrives: to k of the live workers (with over-selection ``ceil(k (1 + o))``),
        its members kept and the rest drawn from the others."""
        if self.closed[0] == 0 and not self.pending[0]:
            self._filling = self._filling or self.members() == {worker}
        else:
            self._filling = False
        if not self._filling:
            super().joined(worker)
            return
        live, members = self.store.live, self.members()
        count = self.draws(len(live))
        rng = random.Random((self.params.seed * 1_000_003 + self.store.version) * 1_000_003
                            + len(live))
        others = sorted(live - members)
        self.round = frozenset(members) | frozenset(rng.sample(others,
                                                               max(0, count - len(members))))

    def draws(self, candidates: int) -> int:
        """How many of `candidates` workers a round draws: k, or ``ceil(k (1 + o))`` with
        over-selection, whose first k reports then close it (sets `wanted`)."""
        wanted: int = self.params.sampled(candidates)
        count: int = min(candidates, math.ceil(wanted * (1 + self.params.overcommit) - 1e-9))
        self.wanted = wanted if count > wanted else None
        return count

    def weight(self, push: Push) -> float:
        """A delta counts in proportion to the samples it was trained on."""
        if push.samples < 1:
            raise Unacceptable("fedavg weights deltas by samples: 'samples' must be >= 1")
        return float(push.samples)


class FedAvgWorker(LocalSgdWorker[FedAvgParams]):
    """Local SGD's loop; with ``local_epochs = E`` each round is E epochs over the worker's
    shard of n_k samples: ``E n_k // B`` steps of the batch B and one of the rest."""

    def plan(self, ctx: Context) -> list[tuple[int, int]]:
        """A round's runs of ``(steps, batch size)``: with ``local_epochs = E``,
        ``(E n_k // B, B)`` and, when ``r = E n_k mod B`` is not 0, ``(1, r)``; either run
        is left out when empty (``E n_k < B``: the one short step). ``r`` may be 1: a step
        of a single sample, which a BatchNorm layer in training mode cannot normalize; the
        plan does not hide it (the trainer decides how to take such a step)."""
        epochs = self.params.local_epochs
        if not epochs:
            return super().plan(ctx)
        if ctx.shard_size is None or ctx.shard_size < 1:
            raise ValueError(f"local_epochs: worker {ctx.rank} cannot count epochs: its batch "
                             f"source tells no shard size (got {ctx.shard_size!r}; a "
                             "BatchSampler does, as in a recipe that trains a model; a "
                             "cycled iterable or the timing model's constant batches do "
                             "not): set local_steps instead")
        full, last = divmod(epochs * ctx.shard_size, ctx.batch_size)
        return [(count, size) for count, size in ((full, ctx.batch_size), (1, last))
                if count and size]


FEDAVG = register(Protocol("fedavg", "federated averaging: sampled clients, H local steps "
                                     "or E epochs, deltas weighted by samples",
                           FedAvgParams, FedAvgServer, FedAvgWorker))
