"""FedAsync: each update is mixed in with weight alpha * s(its own staleness)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import Push
from asyncsync.protocols.fedasync import FedAsyncParams, FedAsyncServer
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_http, run_local


def implied_weight(before: torch.Tensor, after: torch.Tensor, model: torch.Tensor) -> float:
    """The a with ``after = (1 - a) before + a model``, recovered by least squares."""
    direction = model - before
    return float((after - before) @ direction / (direction @ direction))


@pytest.mark.parametrize(("fn", "a", "b", "expected"), [
    ("constant", 0.5, 4, [1.0, 1.0, 1.0, 1.0, 1.0]),
    ("polynomial", 0.5, 4, [1.0, 2 ** -0.5, 3 ** -0.5, 4 ** -0.5, 5 ** -0.5]),
    ("hinge", 10.0, 1, [1.0, 1.0, 1 / 11, 1 / 21, 1 / 31]),
])
async def test_mixing_weight_is_alpha_times_s_of_own_staleness(
        fn: str, a: float, b: int, expected: list[float]) -> None:
    constants: dict[str, Any] = {"constant": {}, "polynomial": {"a": a},
                                 "hinge": {"hinge_a": a, "b": b}}[fn]
    params = FedAsyncParams(alpha=0.6, staleness_fn=fn, **constants)
    gen = torch.Generator().manual_seed(4)
    store = ParameterStore(torch.randn(64, dtype=torch.float64, generator=gen), 2,
                           FlatSGD(0.1))
    rule = FedAsyncServer(params, store)
    # every update starts from version 0, so the d-th one has staleness d
    for staleness, s in enumerate(expected):
        model = torch.randn(64, dtype=torch.float64, generator=gen)
        before = store.w
        meta = await rule.on_push(Push(staleness % 2, 0, "model", model, 8, 128))
        assert store.version == staleness + 1
        assert meta["mixing_weight"] == pytest.approx(0.6 * s, rel=1e-12)
        assert implied_weight(before, store.w, model) == pytest.approx(0.6 * s, rel=1e-9)
        assert torch.allclose(store.w, (1 - 0.6 * s) * before + 0.6 * s * model)
    assert store.staleness.maximum == len(expected) - 1


async def test_updates_apply_on_arrival_without_waiting() -> None:
    core, finals = await run_local("fedasync", [0.002, 0.02],
                                   params=FedAsyncParams(local_steps=2), max_steps=60)
    assert sum(core.store.held_s.values()) == 0.0
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert core.store.staleness.count == len(core.store.commits) >= 20
    assert core.store.staleness.maximum >= 2
    fast, slow = finals
    assert fast["steps"] >= 2 * slow["steps"]


async def test_proximal_term_keeps_local_models_near_the_global_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    distances: list[float] = []
    original = FedAsyncServer.on_push

    async def recording(self: FedAsyncServer, push: Push) -> dict[str, Any]:
        # one worker: every pushed model started from the current global model
        distances.append(float((push.vector - self.store.w).norm()))
        return await original(self, push)

    monkeypatch.setattr(FedAsyncServer, "on_push", recording)
    means = {}
    # lr * rho = 1: each proximal step pulls x all the way back to w before the SGD step
    for rho in (0.0, 10.0):
        distances.clear()
        await run_local("fedasync", [0.0], params=FedAsyncParams(local_steps=8, rho=rho),
                        max_steps=80, lr=0.1)
        assert len(distances) >= 8
        means[rho] = sum(distances) / len(distances)
    assert means[0.0] > 2.5 * means[10.0], means


def test_bad_params_name_the_parameter() -> None:
    cases: list[tuple[str, Any]] = [("alpha", 0.0), ("alpha", 1.5), ("staleness_fn", "linear"),
                                    ("a", -1.0), ("b", -1), ("hinge_a", -1.0),
                                    ("local_steps", 0), ("rho", -0.1)]
    for key, value in cases:
        with pytest.raises(ValueError, match=rf"^{key}:"):
            FedAsyncParams(**{key: value})


async def test_fedasync_over_http() -> None:
    core, finals = await run_http("fedasync", workers=3,
                                  params=FedAsyncParams(local_steps=4, rho=0.01), time_s=1.0)
    assert core.store.version > 5
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert all(f["steps"] > 8 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
