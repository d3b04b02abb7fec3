"""BSP: bulk synchronous parallel (synchronous SGD).

Worker: compute a gradient on its batch at the current global version, push it, pull the
next version. Server: wait for the gradients of every live worker at the current version,
then ``w <- opt_step(w, mean_i g_i)``, version += 1, and release the pulls. Every version
therefore aggregates one gradient per worker in the run, all computed at that version.
The barrier is the SDK's `RoundServer`; a lost worker's gradient of the open round counts
if it arrived (else the step is taken with the others'), and a rejoined worker computes its
gradient at the version it joined and the barrier waits for it.

Backup workers and a deadline (both off by default; `rounds.Cutoff`): with
``backup_workers = b`` a version is made from the first ``N - b`` gradients of the round
(N the live workers), and with ``deadline_s = d`` from those that arrived within d seconds
of the round's first gradient; the step is the mean of the gradients taken. A late
gradient (its round closed without it) is dropped and counted (``rule.late``, and
``RoundRecord.missing`` per round); its worker pulls the newest model and goes on, as in
the paper, where the late gradients of backup workers are discarded.

The same `Cutoff` keys (with over-selection and adaptive deadlines, see
`asyncsync.protocols.rounds`) are taken by local SGD, FedAvg, FedNova, SCAFFOLD and
DiLoCo, where a dropped push throws away several local steps (the price of not waiting,
which federated deployments pay: over-selection is theirs). LB-BSP balances batch sizes
so that every worker arrives together instead, and its global batch and speed estimates
need every worker's gradient; ESync and NBSync shape local work so that nobody is waited
for; Overlap Local SGD and EASGD do not take them.

References: L. G. Valiant, "A bridging model for parallel computation", CACM 1990;
J. Chen, X. Pan, R. Monga, S. Bengio, R. Jozefowicz, "Revisiting Distributed Synchronous
SGD", arXiv:1604.00981, 2016 (backup workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncsync.protocols.base import Protocol, Push, WorkerLoop, register
from asyncsync.protocols.ports import Context
from asyncsync.protocols.rounds import Cutoff, RoundServer, average, contributions


@dataclass(frozen=True)
class BspParams(Cutoff):
    """Parameters of BSP: backup workers and a round deadline (both off by default)."""


class BspServer(RoundServer):
    """A round per version: the weighted mean gradient of the round makes one server step
    (weights: `weight`, equal by default); with `BspParams` a round may close without its
    slowest members."""

    push_kinds = frozenset({"gradient"})

    async def close_round(self, fragment: int, pushes: dict[int, Push]) -> None:
        gradients = [push.vector for push in pushes.values()]
        weights = [self.weight(push) for push in pushes.values()]
        mean = await self.store.compute(average, gradients, weights, True)  # pushes are ours
        await self.store.apply_gradient(mean, contributions(pushes))


class BspWorker(WorkerLoop[BspParams]):
    """Gradient, push and pull (one fused exchange), adopt: one global step per iteration."""

    async def run(self, ctx: Context) -> None:
        while True:
            result, grad = await ctx.gradient(copy=False)  # sent before the next step
            vector, version, _ = await ctx.push_and_pull("gradient", grad, 1, result.samples)
            await ctx.adopt(vector, version)


BSP = register(Protocol("bsp", "synchronous SGD: every live worker's gradient per version "
                               "(or the first N - b, or those in by a deadline), then one "
                               "step", BspParams, BspServer, BspWorker))
