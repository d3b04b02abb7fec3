"""Heterogeneity against closed forms: a Dirichlet partition's class shares have the mean
and spread of Dirichlet(alpha); every partition is reproducible by its seed; a link
carries a message in latency + bytes / rate on the virtual clock, lossy links at Mathis
et al.'s rate."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.hetero.partition import PARTITIONS, partition

LABELS = torch.arange(10).repeat_interleave(600)


@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_dirichlet_class_shares_have_the_dirichlet_mean_and_variance(alpha: float) -> None:
    workers, seeds = 4, 120
    shares = []
    for seed in range(seeds):
        for shard in partition(LABELS, workers, "dirichlet", seed, alpha=alpha):
            shares += (torch.bincount(LABELS[shard], minlength=10) / 600).tolist()
    # a Dirichlet(alpha, ..., alpha) marginal: Beta(alpha, (W - 1) alpha)
    mean = 1 / workers
    variance = mean * (1 - mean) / (workers * alpha + 1)
    assert np.mean(shares) == pytest.approx(mean, abs=1e-9)  # each class is split whole
    assert np.var(shares) == pytest.approx(variance, rel=0.12)


@pytest.mark.parametrize("kind", PARTITIONS)
def test_a_partition_is_a_function_of_its_seed(kind: str) -> None:
    first, again, other = (partition(LABELS, 5, kind, seed, classes_per_worker=2)
                           for seed in (7, 7, 8))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    taken = torch.cat(first)
    assert len(torch.unique(taken)) == len(taken)  # no sample in two shards


def transfer_s(spec: LinkSpec, nbytes: int) -> float:
    """Virtual seconds from sending `nbytes` over `spec`'s uplink (one-way delay first, as
    the virtual transport does) until they are through."""

    async def send() -> float:
        loop = asyncio.get_running_loop()
        link = Link(spec)
        await link.one_way_delay()
        await link.up.sent(nbytes)
        return loop.time()

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(send())
    finally:
        loop.close()


def test_a_message_takes_latency_plus_bytes_over_the_rate() -> None:
    # 1 MB at 20 Mbit/s = 2.5 MB/s: 0.4 s, plus 40 ms of latency
    assert transfer_s(LinkSpec(uplink_mbps=20, latency_ms=40), 1_000_000) == pytest.approx(
        0.44, abs=1e-9)


def test_a_lossy_link_runs_at_the_mathis_rate() -> None:
    # 1 % loss at 20 ms each way: 1448 B x 8 / 0.04 s x sqrt(1.5) / 0.1 = 3.5469 Mbit/s
    rate_bits = 1448 * 8 / 0.04 * math.sqrt(1.5) / 0.1
    seconds = transfer_s(LinkSpec(uplink_mbps=50, latency_ms=20, loss_pct=1), 1_000_000)
    assert seconds == pytest.approx(0.02 + 8e6 / rate_bits, rel=1e-9)
    assert rate_bits / 1e6 == pytest.approx(3.5469, abs=1e-4)
