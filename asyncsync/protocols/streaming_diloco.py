"""Streaming DiLoCo: DiLoCo synchronizing one fragment of the model at a time, overlapped.

The flat vector is split into P fragments (default 4); each is synchronized once every H
inner steps (default 50), fragment p offset by ``p * H // P`` steps so that the exchanges
are staggered over the period: fragment p's exchange starts after local step t when
``t - p * H // P`` is a positive multiple of H. The worker pushes the fragment's
pseudo-gradient ``g_p = w_p - w_i,p`` (``w`` is its copy of the global model) and keeps
training; tau steps later (default 5: the exchange starts tau steps before its result is
needed) it takes the new global fragment, waiting only if it is still in flight, merges
``w_i,p <- (1 - alpha) w_p + alpha w_i,p`` (alpha 0.5) and keeps ``w_p`` as its copy.
Server: DiLoCo's outer Nesterov step, per fragment and with momentum per fragment, when the
pseudo-gradients of every live worker for a fragment's round are in; every such round is a
version.

Membership (see `RoundServer`): a lost worker's pseudo-gradients are withdrawn from the open
rounds. A worker starting its loop asks the server where the schedule stands (a query): it
sets its step counter to the step of the latest exchange that has completed, so that its
next exchange of each fragment is the one the others are in; a rejoined worker thus takes
part in the open rounds without deadlocking the staggered schedule.

Fragments travel as partial vectors: pushes and pull replies carry only the fragment's
elements. **(choice)** Fragments are contiguous slices of the flat vector of nearly equal
length (groups of consecutive layers; the paper also tries strided layer patterns). With
``fragments = 1``, ``overlap_steps = 0`` and ``alpha = 0`` this is DiLoCo.

Reference: A. Douillard et al., "Streaming DiLoCo with overlapping communication: Towards
a Distributed Free Lunch", arXiv:2501.18512, 2025.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asyncsync.protocols.base import Protocol, WorkerLoop, register
from asyncsync.protocols.diloco import DilocoParams, DilocoServer, pseudo_gradient
from asyncsync.protocols.overlap import Pulled, Transfers, exchange, mix_into
from asyncsync.schema import option

if TYPE_CHECKING:
    from asyncsync.trainer import Trainer
    from asyncsync.worker import WorkerContext


@dataclass(frozen=True)
class StreamingDilocoParams(DilocoParams):
    """Parameters of Streaming DiLoCo (DiLoCo's, plus fragments, overlap and merge)."""

    fragments: int = option(4, lambda v: v >= 1, "must be >= 1",
                            "P: fragments of the model, synchronized in turn")
    overlap_steps: int = option(5, lambda v: v >= 0, "must be >= 0",
                                "tau: local steps from a fragment's push to its merge")
    alpha: float = option(0.5, lambda v: 0 <= v <= 1, "must be in [0, 1]",
                          "weight of the local fragment in the merge")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlap_steps >= self.inner_steps:
            raise ValueError(f"overlap_steps: must be < inner_steps ({self.inner_steps}), "
                             f"got {self.overlap_steps}")


def fragment_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous slices of ``range(numel)`` whose lengths differ by at most one."""
    return [(numel * p // parts, numel * (p + 1) // parts) for p in range(parts)]


class StreamingDilocoServer(DilocoServer):
    """DiLoCo's server with one barrier and one outer optimizer per fragment; it tells a
    (re)joining worker where the exchange schedule stands."""

    def fragments(self) -> list[tuple[int, int]]:
        parts, numel = self.params.fragments, self.store.w.numel()
        if parts > numel:
            raise ValueError(f"fragments: must be <= the model's {numel} elements, got {parts}")
        return fragment_bounds(numel, parts)

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The local step of the latest completed exchange (0 before any): fragment p's
        round r was exchanged after step ``p * H // P + (r + 1) * H``."""
        h, parts = self.params.inner_steps, self.params.fragments
        step = max((fragment * h // parts + done * h for fragment, done in enumerate(self._done)
                    if done), default=0)
        return {"step": step}


def merge_fragment(trainer: Trainer, anchor: torch.Tensor, fresh: torch.Tensor, alpha: float,
                   start: int, stop: int) -> None:
    """Keep `fresh` as the global copy; ``w_i <- (1 - alpha) fresh + alpha w_i`` there."""
    anchor[start:stop].copy_(fresh)
    mix_into(trainer, fresh, 1 - alpha, start, stop)


def starts_after(step: int, fragment: int, params: StreamingDilocoParams) -> bool:
    """Whether `fragment`'s exchange starts right after local step `step`."""
    since = step - fragment * params.inner_steps // params.fragments
    return since >= params.inner_steps and since % params.inner_steps == 0


def next_event(step: int, params: StreamingDilocoParams) -> int:
    """The first local step after `step` at which an exchange starts or a merge is due."""
    event = step + 1
    while not any(starts_after(event, fragment, params)
                  or starts_after(event - params.overlap_steps, fragment, params)
                  for fragment in range(params.fragments)):
        event += 1
    return event


class StreamingDilocoWorker(WorkerLoop):
    """Local steps in blocks up to the next exchange or merge; staggered fragment exchanges
    in the background, each merged tau steps after it started.

    A failed exchange (e.g. the run stopped) surfaces at the end of the current block. The
    step counter starts where the server's schedule stands (0 at the start of a run); a
    merge due for an exchange this loop did not start is skipped.
    """

    async def run(self, ctx: WorkerContext) -> None:
        params: StreamingDilocoParams = self.params
        bounds = fragment_bounds(ctx.trainer.numel, params.fragments)
        anchor = await ctx.in_thread(ctx.trainer.vector_copy)
        step = int((await ctx.query({}))["step"])
        version, samples = ctx.version, 0
        pushed = [(step, 0)] * params.fragments  # (step, samples) at each fragment's last push
        async with Transfers[Pulled]() as transfers:
            while True:
                event = next_event(step, params)
                samples += (await ctx.steps(event - step)).samples
                step = event
                transfers.check()
                for fragment, (start, stop) in enumerate(bounds):
                    if starts_after(step, fragment, params):
                        pseudo = await ctx.in_thread(pseudo_gradient, ctx.trainer, anchor,
                                                     start, stop)
                        last_step, last_samples = pushed[fragment]
                        transfers.start(fragment, exchange(
                            ctx, "gradient", pseudo, steps=step - last_step,
                            samples=samples - last_samples, base_version=version,
                            meta={"fragment": fragment}))
                        pushed[fragment] = (step, samples)
                    if (starts_after(step - params.overlap_steps, fragment, params)
                            and fragment in transfers):
                        fresh, fresh_version = await transfers.finish(fragment)
                        version = max(version, fresh_version)
                        await ctx.in_thread(merge_fragment, ctx.trainer, anchor, fresh,
                                            params.alpha, start, stop)


STREAMING_DILOCO = register(Protocol(
    "streaming_diloco", "DiLoCo over staggered model fragments, overlapped with local steps",
    StreamingDilocoParams, StreamingDilocoServer, StreamingDilocoWorker))
