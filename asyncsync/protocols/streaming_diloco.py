"""Streaming DiLoCo: DiLoCo synchronizing one fragment of the model at a time, overlapped.

The flat vector is split into P fragments (default 4), each synchronized once every H
inner steps (default 50), on a staggered schedule: fragment p is merged after local steps
``floor(H (p + 1) / P) + k H`` (k = 0, 1, ...), the torchft placement, so one fragment is
merged every H / P steps. Its exchange starts tau steps before its merge (default 5;
tau < H // P, so a fragment's exchange ends before the next fragment's starts): the worker
pushes the fragment's delta ``d_p = w_i,p - w_p`` (``w`` is its copy of the global model)
and keeps training; at the merge step it takes the new global fragment, waiting only if
it is still in flight, merges ``w_i,p <- (1 - alpha) w_p + alpha w_i,p`` (alpha 0.5) and
keeps ``w_p`` as its copy. Server: DiLoCo's outer Nesterov step on ``-mean_i d_i,p`` (and
the buffers' mean), per fragment and with momentum per fragment, when the deltas of every
live worker for a fragment's round are in; every such round is a version.

Membership (see `RoundServer`): a lost worker's deltas that arrived count in the open rounds.
A worker starting its loop asks the server where the schedule stands (a query): it sets
its step counter to the push step of the latest exchange that has completed, so that its
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
from typing import Any, ClassVar

from asyncsync.protocols.base import Protocol, WorkerLoop, option, register
from asyncsync.protocols.diloco import DilocoParams, DilocoServer
from asyncsync.protocols.overlap import Pulled, Transfers, push_then_pull
from asyncsync.protocols.ports import Context
from asyncsync.protocols.rounds import CUTOFF_OPTIONS


@dataclass(frozen=True)
class StreamingDilocoParams(DilocoParams):
    """Parameters of Streaming DiLoCo (DiLoCo's, plus fragments, overlap and merge)."""

    REFUSED_OPTIONS: ClassVar[frozenset[str]] = CUTOFF_OPTIONS

    fragments: int = option(4, lambda v: v >= 1, "must be >= 1",
                            "P: fragments of the model, synchronized in turn")
    overlap_steps: int = option(5, lambda v: v >= 0, "must be >= 0",
                                "tau: local steps from a fragment's push to its merge")
    alpha: float = option(0.5, lambda v: 0 <= v <= 1, "must be in [0, 1]",
                          "weight of the local fragment in the merge")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.refuse_cutoff("streaming DiLoCo", "its fragments' rounds advance the version "
                           "between a push and its round's close")
        if self.fragments > self.inner_steps:
            raise ValueError(f"fragments: must be <= inner_steps ({self.inner_steps}), "
                             f"got {self.fragments}")
        if self.overlap_steps >= self.inner_steps // self.fragments:
            raise ValueError(f"overlap_steps: must be < inner_steps // fragments "
                             f"({self.inner_steps // self.fragments}), got {self.overlap_steps}")

    def merge_offset(self, fragment: int) -> int:
        """The first local step after which `fragment` is merged."""
        return self.inner_steps * (fragment + 1) // self.fragments

    def merges_after(self, step: int, fragment: int) -> bool:
        """Whether `fragment` is merged right after local step `step`."""
        since = step - self.merge_offset(fragment)
        return since >= 0 and since % self.inner_steps == 0

    def pushes_after(self, step: int, fragment: int) -> bool:
        """Whether `fragment`'s exchange starts right after local step `step`."""
        return self.merges_after(step + self.overlap_steps, fragment)

    def next_event(self, step: int) -> int:
        """The first local step after `step` at which an exchange starts or a merge is due."""
        event = step + 1
        while not any(self.pushes_after(event, p) or self.merges_after(event, p)
                      for p in range(self.fragments)):
            event += 1
        return event


def fragment_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous slices of ``range(numel)`` whose lengths differ by at most one."""
    return [(numel * p // parts, numel * (p + 1) // parts) for p in range(parts)]


class StreamingDilocoServer(DilocoServer):
    """DiLoCo's server with one barrier and one outer optimizer per fragment; it tells a
    (re)joining worker where the exchange schedule stands."""

    same_version = False  # other fragments' rounds advance the version in between

    def fragments(self) -> list[tuple[int, int]]:
        parts, numel = self.params.fragments, self.store.numel
        if parts > numel:
            raise ValueError(f"fragments: must be <= the model's {numel} elements, got {parts}")
        return fragment_bounds(numel, parts)

    async def on_query(self, worker: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The local step after which the latest completed exchange was pushed (0 before
        any): fragment p's round r was pushed after step ``merge_offset(p) + r H - tau``."""
        params: StreamingDilocoParams = self.params
        step = max((params.merge_offset(fragment) + (done - 1) * params.inner_steps
                    - params.overlap_steps
                    for fragment, done in enumerate(self.closed) if done), default=0)
        return {"step": step}


class StreamingDilocoWorker(WorkerLoop[StreamingDilocoParams]):
    """Local steps in blocks up to the next exchange or merge; staggered fragment exchanges
    in the background, each merged tau steps after it started.

    A failed exchange (e.g. the run stopped) surfaces at the end of the current block. The
    step counter starts where the server's schedule stands (0 at the start of a run); a
    merge due for an exchange this loop did not start is skipped.
    """

    async def run(self, ctx: Context) -> None:
        params: StreamingDilocoParams = self.params
        bounds = fragment_bounds(ctx.numel, params.fragments)
        anchor = await ctx.snapshot()
        step = int((await ctx.query({}))["step"])
        version, samples = ctx.version, 0
        pushed = [(step, 0)] * params.fragments  # (step, samples) at each fragment's last push
        async with Transfers[Pulled]() as transfers:
            while True:
                event = params.next_event(step)
                samples += (await ctx.steps(event - step)).samples
                step = event
                transfers.check()
                for fragment, (start, stop) in enumerate(bounds):
                    if params.pushes_after(step, fragment):
                        delta = await ctx.delta_since(anchor, start, stop)
                        last_step, last_samples = pushed[fragment]
                        transfers.start(fragment, push_then_pull(
                            ctx, "delta", delta, steps=step - last_step,
                            samples=samples - last_samples, base_version=version,
                            meta={"fragment": fragment}))
                        pushed[fragment] = (step, samples)
                    if params.merges_after(step, fragment) and fragment in transfers:
                        fresh, fresh_version = await transfers.finish(fragment)
                        version = max(version, fresh_version)
                        await ctx.compute(anchor[start:stop].copy_, fresh)
                        await ctx.mix_toward(fresh, 1 - params.alpha, start, stop)


STREAMING_DILOCO = register(Protocol(
    "streaming_diloco", "DiLoCo over staggered model fragments, overlapped with local steps",
    StreamingDilocoParams, StreamingDilocoServer, StreamingDilocoWorker))
