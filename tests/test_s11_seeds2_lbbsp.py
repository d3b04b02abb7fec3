"""LB-BSP predicts each worker's speed with an exponentially weighted moving average.

``v_i <- beta v_i + (1 - beta) measured`` (``smoothing`` = beta, the weight of the past):
a sudden change of speed moves the batch sizes only part of the way, unlike a predictor
that takes the latest measurement as it is.
"""

from __future__ import annotations

import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Push
from asyncsync.protocols.lbbsp import LbbspParams, LbbspServer
from asyncsync.training.optim import FlatSGD


async def push_round(rule: LbbspServer, version: int, sizes: list[int],
                     seconds: list[float]) -> None:
    for rank, (size, t) in enumerate(zip(sizes, seconds, strict=True)):
        await rule.on_push(Push(rank, version, "gradient", torch.zeros(4), 1, size,
                                {"compute_s": t}))


async def test_speed_estimate_is_the_moving_average_of_measured_speeds() -> None:
    store = ParameterStore(torch.zeros(4), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = LbbspServer(LbbspParams(global_batch=80, smoothing=0.75), store)
    await push_round(rule, 0, [40, 40], [40.0, 40.0])  # both 1 sample/s: sizes stay
    assert rule.batches == {0: 40, 1: 40}
    await push_round(rule, 1, [40, 40], [40 / 3, 40.0])  # worker 0 now measures 3/s
    # v0 = 0.75 * 1 + 0.25 * 3 = 1.5, v1 = 1: X split 1.5 : 1 is 48 : 32 (gain 1, no
    # reversal); the latest measurement alone (3 : 1) would give 60 : 20
    assert rule.speeds == [1.5, 1.0]
    assert rule.batches == {0: 48, 1: 32}
