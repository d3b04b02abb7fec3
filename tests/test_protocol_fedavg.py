"""FedAvg: deltas weighted by samples; each round trains only its sampled fraction C."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.optim import FlatSGD
from asyncsync.protocols.base import Push
from asyncsync.protocols.fedavg import FedAvgParams, FedAvgServer
from asyncsync.wire import WireError
from tests.helpers import run_http, run_local


async def test_round_weights_deltas_by_samples() -> None:
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(40, generator=gen)
    store = ParameterStore(w0, 3, FlatSGD(0.1))
    store.live.update(range(3))
    rule = FedAvgServer(FedAvgParams(), store)
    deltas = [torch.randn(40, generator=gen) for _ in range(3)]
    with pytest.raises(WireError) as err:
        await rule.on_push(Push(0, 0, "delta", deltas[0], 8, 0))
    assert err.value.status == 422
    for rank, samples in enumerate([10, 30, 60]):
        await rule.on_push(Push(rank, 0, "delta", deltas[rank], 8, samples))
    assert store.version == 1
    expected = w0 + 0.1 * deltas[0] + 0.3 * deltas[1] + 0.6 * deltas[2]
    assert torch.allclose(store.w, expected, atol=1e-6)
    # equal weights (local SGD) would land far from it
    assert not torch.allclose(store.w, w0 + sum(deltas) / 3, atol=1e-2)


async def test_each_round_trains_exactly_its_sampled_clients() -> None:
    params = FedAvgParams(local_steps=2, fraction=0.5, seed=3)
    core, finals = await run_local("fedavg", [0.0, 0.0, 0.002, 0.002], params=params,
                                   time_s=1.0)
    rule = core.rule
    assert isinstance(rule, FedAvgServer)
    commits = core.store.commits
    assert len(commits) >= 10
    chosen = []
    for commit in commits:
        ranks = frozenset(w for w, _ in commit.contributions)
        assert len(ranks) == len(commit.contributions) == 2, commit
        assert ranks == rule.participants(commit.version - 1, range(4)), commit
        assert all(base == commit.version - 1 for _, base in commit.contributions), commit
        chosen.append(ranks)
    assert len(set(chosen)) >= 3
    assert set().union(*chosen) == {0, 1, 2, 3}
    # workers not sampled did not compute: total steps are 2 clients x H per round
    total = sum(f["steps"] for f in finals)
    assert len(commits) * 2 * 2 <= total <= (len(commits) + 1) * 2 * 2


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^fraction:"):
        FedAvgParams(fraction=0.0)
    with pytest.raises(ValueError, match=r"^fraction:"):
        FedAvgParams(fraction=1.5)
    with pytest.raises(ValueError, match=r"^local_steps:"):
        FedAvgParams(local_steps=0)


async def test_fedavg_over_http() -> None:
    core, finals = await run_http("fedavg", workers=3, params=FedAvgParams(4), time_s=1.0)
    assert core.store.version > 3
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert all(f["steps"] > 8 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
