"""FedBuff: every K arrivals make one version of staleness-weighted deltas; nobody waits;
K = N with equal speeds and s = 1 is synchronous delta averaging."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.hetero.network import LinkSpec
from asyncsync.protocols.base import Push
from asyncsync.protocols.fedbuff import FedBuffParams, FedBuffServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import ranks, run_crash_and_rejoin, run_local


async def test_k_staleness_weighted_deltas_make_one_version() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(12, dtype=torch.float64, generator=gen)
    store = ParameterStore(w0, 3, FlatSGD(0.1))
    rule = FedBuffServer(FedBuffParams(buffer_size=3, server_lr=0.5), store)  # s: (d+1)^-0.5
    first = [torch.randn(12, dtype=torch.float64, generator=gen) for _ in range(3)]
    metas = [await rule.on_push(Push(w, 0, "delta", d.clone(), 8, 128))
             for w, d in enumerate(first)]
    assert [m["buffered"] for m in metas] == [1, 2, 0]
    assert store.version == 1
    w1 = w0 + 0.5 * (first[0] + first[1] + first[2]) / 3
    assert torch.allclose(store.w, w1, rtol=1e-12)

    # staleness 1, 0, 1 at version 1: weights 2^-0.5, 1, 2^-0.5
    second = [torch.randn(12, dtype=torch.float64, generator=gen) for _ in range(3)]
    metas = []
    for worker, base in [(2, 0), (0, 1), (1, 0)]:
        metas.append(await rule.on_push(Push(worker, base, "delta",
                                             second[len(metas)].clone(), 8, 128)))
        assert store.version == (1 if len(metas) < 3 else 2)
    assert [m["staleness_weight"] for m in metas] == pytest.approx([2**-0.5, 1.0, 2**-0.5])
    w2 = w1 + 0.5 * (2**-0.5 * second[0] + second[1] + 2**-0.5 * second[2]) / 3
    assert torch.allclose(store.w, w2, rtol=1e-12)
    assert [sorted(c.contributions) for c in store.commits] == [
        [(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 0), (2, 0)]]
    assert store.staleness.maximum == 1


@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int, torch.Tensor]]]:
    """Every push a FedBuff server takes: ``(worker, base_version, delta)``, in order (and
    the first global model, as worker -1)."""
    seen: list[tuple[int, int, torch.Tensor]] = []
    original = FedBuffServer.on_push

    async def recording(self: FedBuffServer, push: Push) -> dict[str, Any]:
        if not seen:
            seen.append((-1, 0, self.store.w.clone()))
        seen.append((push.worker, push.base_version, push.vector.clone()))
        return await original(self, push)

    monkeypatch.setattr(FedBuffServer, "on_push", recording)
    yield seen


async def test_a_version_every_k_arrivals_and_nobody_waits_for_the_straggler(
        arrivals: list[tuple[int, int, torch.Tensor]]) -> None:
    params = FedBuffParams(local_steps=2, buffer_size=2)
    core, finals = await run_local("fedbuff", [0.0, 0.004, 0.03], params=params,
                                   max_steps=80)
    pushes = len(arrivals) - 1
    assert core.store.version == pushes // 2 >= 15
    assert isinstance(core.rule, FedBuffServer)
    assert len(core.rule.buffered) == pushes % 2
    assert all(len(c.contributions) == 2 for c in core.store.commits)
    assert sum(core.store.held_s.values()) == 0.0
    fast, _, slow = finals
    assert fast["steps"] >= 5 * slow["steps"]
    # the straggler's deltas were taken, late: the fast workers made versions meanwhile
    late = [c.version - 1 - base for c in core.store.commits
            for worker, base in c.contributions if worker == 2]
    assert late and min(late) >= 1
    # the fastest worker may fill a buffer alone
    assert any(ranks(c) == {0} for c in core.store.commits)


async def test_k_equal_n_with_equal_speeds_and_s_1_is_synchronous_averaging(
        arrivals: list[tuple[int, int, torch.Tensor]]) -> None:
    params = FedBuffParams(local_steps=3, buffer_size=3, staleness_fn="constant")
    # a 1 ms link: the round's three pushes arrive before anybody's next pull
    core, _ = await run_local("fedbuff", [0.0, 0.0, 0.0], params=params, max_steps=45,
                              link=LinkSpec(latency_ms=1.0))
    assert core.store.version >= 10
    assert core.store.staleness.maximum == 0
    # synchronous delta averaging, by hand: w_{v+1} = w_v + mean of the three deltas of
    # round v, one per worker, each computed from w_v
    (_, _, w), taken = arrivals[0], arrivals[1:]
    for version in range(core.store.version):
        round_pushes = taken[3 * version:3 * version + 3]
        assert sorted(worker for worker, _, _ in round_pushes) == [0, 1, 2]
        assert all(base == version for _, base, _ in round_pushes)
        w = w + (round_pushes[0][2] + round_pushes[1][2] + round_pushes[2][2]) / 3
    assert torch.allclose(core.store.w, w, atol=1e-6)


async def test_fedbuff_trains() -> None:
    core, _ = await run_local("fedbuff", [0.0, 0.002, 0.006],
                              params=FedBuffParams(local_steps=4, buffer_size=2), time_s=2.0)
    assert core.store.version >= 20
    assert core.evals[-1].accuracy > 0.85
    assert core.evals[-1].loss < 0.6 * core.evals[0].loss


async def test_a_lost_worker_stops_contributing_and_a_rejoined_one_contributes_again() -> None:
    run = await run_crash_and_rejoin("fedbuff", [0.005, 0.01, 0.02], victim=2,
                                     params=FedBuffParams(local_steps=2, buffer_size=2))
    assert run.core.workers[2].lost == 1
    # after the loss (the first version may still hold a delta it sent before), versions
    # are made of the others' deltas, two each
    without = run.between(run.lost_at + 2, run.restarted_at)
    assert len(without) >= 2
    assert all(ranks(c) <= {0, 1} and len(c.contributions) == 2 for c in without)
    assert any(2 in ranks(c) for c in run.between(run.restarted_at + 1, run.core.store.version))


def test_bad_params_name_the_parameter() -> None:
    cases: list[tuple[str, Any]] = [("buffer_size", 0), ("local_steps", 0),
                                    ("staleness_fn", "linear"), ("a", -1.0), ("mu", -0.1)]
    for key, value in cases:
        with pytest.raises(ValueError, match=rf"^{key}:"):
            FedBuffParams(**{key: value})
