"""Streaming DiLoCo with one fragment, no overlap and alpha = 0 is DiLoCo (its docstring's
claim): on two workers' quadratics ``|x - o_i|^2 / 2`` both give, round after round, the
outer Nesterov steps computed here in closed form: H local steps of rate lr from w end at
``o_i + (1 - lr)^H (w - o_i)``, the pseudo-gradient is ``g = -mean_i (x_i - w)``, and
torch's Nesterov SGD steps ``w - 0.7 (g + 0.9 b)`` with ``b <- 0.9 b + g`` (``b = g`` at
first)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncsync.protocols.base import RunStopped, ServerRule, WorkerLoop
from asyncsync.protocols.diloco import DilocoParams, DilocoServer, DilocoWorker
from asyncsync.protocols.streaming_diloco import (
    StreamingDilocoParams,
    StreamingDilocoServer,
    StreamingDilocoWorker,
)
from asyncsync.protocols.testing import FakeContext, FakeStore, checked_context

H, LR, ROUNDS = 3, 0.1, 3
OPTIMA = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([-3.0, 4.0, 2.5])]
W0 = torch.tensor([0.5, 0.5, -1.0])


def closed_form() -> torch.Tensor:
    w, buffer = W0.clone(), None
    for _ in range(ROUNDS):
        ends = [o + (1 - LR) ** H * (w - o) for o in OPTIMA]
        g = -sum((x - w for x in ends), torch.zeros(3)) / len(ends)
        buffer = g if buffer is None else 0.9 * buffer + g
        w = w - 0.7 * (g + 0.9 * buffer)
    return w


async def _run(rule_of: Any, worker: WorkerLoop[Any]) -> torch.Tensor:
    store = FakeStore(W0.clone(), len(OPTIMA))
    rule: ServerRule[Any] = rule_of(store)

    def toward(optimum: torch.Tensor) -> Any:
        return lambda local: local - optimum

    contexts = [FakeContext(store, rule, rank=k, lr=LR, max_steps=ROUNDS * H,
                            grad_fn=toward(o)) for k, o in enumerate(OPTIMA)]
    outcomes = await asyncio.wait_for(asyncio.gather(
        *(worker.run(checked_context(ctx)) for ctx in contexts), return_exceptions=True), 10)
    assert all(isinstance(out, RunStopped) for out in outcomes), outcomes
    assert store.version == ROUNDS
    return store.w


@pytest.mark.parametrize("protocol", ["diloco", "streaming_diloco"])
async def test_one_fragment_without_overlap_or_mixing_is_diloco(protocol: str) -> None:
    if protocol == "diloco":
        params: DilocoParams = DilocoParams(inner_steps=H)
        w = await _run(lambda store: DilocoServer(params, store), DilocoWorker(params))
    else:
        streaming = StreamingDilocoParams(inner_steps=H, fragments=1, overlap_steps=0,
                                          alpha=0.0)
        w = await _run(lambda store: StreamingDilocoServer(streaming, store),
                       StreamingDilocoWorker(streaming))
    assert torch.allclose(w, closed_form(), atol=1e-6)
