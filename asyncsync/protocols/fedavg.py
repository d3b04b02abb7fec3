"""FedAvg: federated averaging, local SGD weighted by samples with client sampling.

Local SGD (see `asyncsync.protocols.local_sgd`) with two changes, made by overriding its
server's hooks: a round's participants are ``m = max(1, round(C * n))`` of the n live
workers, sampled without replacement (seeded by ``(seed, version)``, so a run is
reproducible), and the deltas are weighted by their sample counts,
``w <- w + sum_i (n_i / n) delta_i`` with ``n = sum_i n_i`` over the round's deltas. Workers
not sampled for a round stay idle until a round includes them. With C = 1 (the default)
every live worker trains in every round. Local SGD's options apply: FedProx's proximal
term (``mu``) and a server optimizer on the weighted mean delta (``server_optimizer``:
FedAdam, FedYogi, FedAdagrad; see `asyncsync.protocols.server_optim`), and the round
policies of `asyncsync.protocols.rounds.Cutoff`: backup workers count within the round's
k sampled workers (at most k - 1 of them, for the run's size); with ``overcommit = o`` a round draws
``ceil(m (1 + o))`` workers and closes with the first m deltas (over-selection, as in
Bonawitz et al., MLSys 2019); deadlines, fixed or adaptive, close it with what arrived.

Membership is local SGD's: a lost participant's delta is withdrawn and the round closes
with the others' (it is drawn again if no participant is left); a rejoined worker joins
the open round when C = 1, otherwise it waits until a round samples it.

Reference: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas,
"Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass

from asyncsync.protocols.base import Protocol, Push, Unacceptable, option, register
from asyncsync.protocols.local_sgd import LocalSgdParams, LocalSgdServer, LocalSgdWorker


@dataclass(frozen=True)
class FedAvgParams(LocalSgdParams):
    """Parameters of FedAvg (local SGD's, plus client sampling)."""

    fraction: float = option(1.0, lambda v: 0 < v <= 1, "must be in (0, 1]",
                             "C: fraction of the live workers sampled for each round")
    seed: int = option(0, help="seed of the client sampling")

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
    """Local SGD's rounds over a sampled fraction of the live workers, weighted by samples."""

    def participants(self, version: int, candidates: Collection[int]) -> frozenset[int]:
        """``k = max(1, round(C * n))`` of the n `candidates`, drawn afresh for each round;
        with over-selection ``ceil(k (1 + overcommit))`` of them, of which the first k
        reports close the round."""
        pool = sorted(candidates)
        wanted = self.params.sampled(len(pool))
        count = min(len(pool), math.ceil(wanted * (1 + self.params.overcommit) - 1e-9))
        self.wanted = wanted
        rng = random.Random(self.params.seed * 1_000_003 + version)
        return frozenset(rng.sample(pool, count))

    def weight(self, push: Push) -> float:
        """A delta counts in proportion to the samples it was trained on."""
        if push.samples < 1:
            raise Unacceptable("fedavg weights deltas by samples: 'samples' must be >= 1")
        return float(push.samples)


FEDAVG = register(Protocol("fedavg", "federated averaging: sampled clients, H local steps, "
                                     "deltas weighted by samples",
                           FedAvgParams, FedAvgServer, LocalSgdWorker))
