"""LB-BSP: batch re-sizing makes workers finish together; the step uses the global batch."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from asyncsync.engine.compute import ThreadedWorkerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import StaticSlowdown
from asyncsync.protocols.base import BadRequest, OutOfStep, Pull, Push, Refused
from asyncsync.protocols.lbbsp import LbbspParams, LbbspServer, apportion
from asyncsync.training.optim import FlatSGD
from asyncsync.training.trainer import BatchSource, FlatModule
from asyncsync.transport.local import LocalTransport
from tests.helpers import run_http, run_workers, tiny_data, tiny_model


def batch_gradient(module: FlatModule, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean cross-entropy of one batch, as a flat vector."""
    module.grad.zero_()
    torch.autograd.backward(F.cross_entropy(module.module(x), y))
    return module.grad.clone()


async def push_round(rule: LbbspServer, version: int, grads: list[torch.Tensor],
                     sizes: list[int], seconds: list[float]) -> None:
    for rank, (grad, size, t) in enumerate(zip(grads, sizes, seconds, strict=True)):
        await rule.on_push(Push(rank, version, "gradient", grad, 1, size, {"compute_s": t}))


async def test_step_is_the_global_batch_gradient_and_sizes_follow_speed() -> None:
    x, y = tiny_data()
    module = FlatModule(tiny_model(), torch.device("cpu"))
    store = ParameterStore(module.flat.detach().clone(), 3, FlatSGD(0.1))
    store.live.update(range(3))
    rule = LbbspServer(LbbspParams(), store)
    sizes = [5, 11, 16]  # first batches: X = 32 is inferred from them
    for version in range(2):
        w = store.w
        module.flat.data.copy_(w)
        bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
        parts = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]
        grads = [batch_gradient(module, *part) for part in parts]
        union = batch_gradient(module, x[: bounds[-1]], y[: bounds[-1]])
        # measured speeds 1 : 2 : 4 samples/s
        await push_round(rule, version, grads, sizes, [s / v for s, v in zip(sizes, [1, 2, 4],
                                                                               strict=True)])
        assert store.version == version + 1
        assert torch.allclose(store.w, w - 0.1 * union, atol=1e-6)
        # the plain mean of the three gradients (BSP) is a different step
        assert not torch.allclose(store.w, w - 0.1 * sum(grads) / 3, atol=1e-4)
        replies = [await rule.on_pull(Pull(rank, version)) for rank in range(3)]
        sizes = [reply.meta["batch_size"] for reply in replies]
        assert sum(sizes) == 32
        assert sizes == [5, 9, 18]  # 32 * (1, 2, 4) / 7, rounded to sum to 32


async def test_pushes_that_break_the_assignment_are_rejected() -> None:
    store = ParameterStore(torch.zeros(10), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = LbbspServer(LbbspParams(global_batch=20), store)
    bad: list[tuple[dict[str, Any], int, type[Refused]]] = [
        ({}, 10, BadRequest), ({"compute_s": 0.0}, 10, BadRequest),
        ({"compute_s": "1"}, 10, BadRequest), ({"compute_s": float("nan")}, 10, BadRequest),
        ({"compute_s": 0.1}, 0, BadRequest),  # a gradient of no samples cannot be weighted
        ({"compute_s": 0.1}, 11, OutOfStep),  # more samples than the 10 assigned
    ]
    for meta, samples, refusal in bad:
        with pytest.raises(refusal):
            await rule.on_push(Push(0, 0, "gradient", torch.ones(10), 1, samples, meta))
    assert store.version == 0
    # nothing of the rejected pushes was kept: two valid pushes complete the barrier
    await push_round(rule, 0, [torch.ones(10), torch.ones(10)], [10, 10], [0.1, 0.1])
    assert store.version == 1
    assert torch.allclose(store.w, torch.full((10,), -0.1))


async def test_extreme_compute_times_are_refused_and_never_wedge_the_barrier() -> None:
    """A compute time of 1e-308 s made a speed of inf: the round committed, then its batch
    sizes raised OverflowError (a 500) and the round stayed open, refusing every later push
    as 'already pushed' (the run was stuck)."""
    store = ParameterStore(torch.zeros(10), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = LbbspServer(LbbspParams(global_batch=20), store)
    for seconds in (1e-308, 5e-324, 1e308, math.inf):
        with pytest.raises(BadRequest, match="compute_s"):
            await rule.on_push(Push(0, 0, "gradient", torch.ones(10), 1, 10,
                                    {"compute_s": seconds}))
    assert store.version == 0
    for version, both in enumerate([(1e-9, 1e9), (1e9, 1e-9), (1e-9, 1e-9)]):
        await push_round(rule, version, [torch.ones(10), torch.ones(10)],
                         [rule.batches[0], rule.batches[1]], list(both))
        assert store.version == version + 1
        sizes = [rule.batches[0], rule.batches[1]]
        assert sum(sizes) == 20 and min(sizes) >= 1


async def test_a_smaller_batch_counts_by_the_samples_it_held() -> None:
    store = ParameterStore(torch.zeros(10), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = LbbspServer(LbbspParams(global_batch=20), store)
    assert rule.batches == {0: 10, 1: 10}
    # worker 0's source ran short: 4 of its 10 samples; the step weights 4 : 10
    await push_round(rule, 0, [torch.ones(10), torch.full((10,), 8.0)], [4, 10], [0.1, 0.1])
    assert store.version == 1
    assert torch.allclose(store.w, torch.full((10,), -0.1 * (4 * 1.0 + 10 * 8.0) / 14))


async def test_damping_halves_the_step_when_an_adjustment_reverses() -> None:
    store = ParameterStore(torch.zeros(10), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = LbbspServer(LbbspParams(global_batch=64, smoothing=0.0), store)
    grads = [torch.zeros(10), torch.zeros(10)]
    assert rule.batches == {0: 32, 1: 32}
    await push_round(rule, 0, grads, [32, 32], [32 / 3, 32.0])  # speeds 3 : 1
    assert rule.batches == {0: 48, 1: 16}  # first move: all the way to the target
    await push_round(rule, 1, grads, [48, 16], [48.0, 16.0])  # speeds 1 : 1, target 32 : 32
    assert rule.gains == [0.5, 0.5]
    assert rule.batches == {0: 40, 1: 24}  # reversal: half the way
    await push_round(rule, 2, grads, [40, 24], [40.0, 24.0])  # same direction again
    assert rule.gains == [0.75, 0.75]
    assert rule.batches == {0: 34, 1: 30}


def test_apportion_respects_bounds_and_total() -> None:
    assert apportion(112, [4.0, 2.0, 1.0], 1, 112) == [64, 32, 16]
    assert apportion(100, [1.0, 1.0, 1.0], 1, 100) == [34, 33, 33]
    assert apportion(30, [100.0, 1.0, 1.0], 5, 18) == [18, 6, 6]


def sleepy_batches(per_sample_s: float, seed: int) -> BatchSource:
    """Batches whose cost is proportional to their size (a scripted per-sample slowdown)."""
    x, y = tiny_data()
    gen = torch.Generator().manual_seed(seed)

    def next_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(size * per_sample_s)
        idx = torch.randint(len(y), (size,), generator=gen)
        return x[idx], y[idx]

    return next_batch


PER_SAMPLE_S = 0.002
"""What a sample costs the fastest sleepy worker: large beside the few milliseconds a
loaded host (a busy core beside the suite's other process) adds to a step at random,
which at 1 ms once put the settled rounds' spread at 0.102."""


async def run_sleepy(factors: list[float], params: LbbspParams, time_s: float,
                     monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[ServerCore, list[tuple[int, int, int, float]]]:
    """Workers costing `PER_SAMPLE_S` x factor per sample; returns the core and every
    accepted push as ``(version, worker, samples, compute_s)``."""
    x, y = tiny_data()
    core = build_core(tiny_model(), "lbbsp", len(factors),
                      ServerSettings(lr=0.1, time_s=time_s, eval_interval_s=0.5),
                      protocol_params=params, test_data=(x, y))
    rule = core.rule
    assert isinstance(rule, LbbspServer)
    pushes: list[tuple[int, int, int, float]] = []
    original = rule.on_push

    async def recording(push: Push) -> dict[str, Any]:
        reply = await original(push)
        pushes.append((push.base_version, push.worker, push.samples, push.meta["compute_s"]))
        return reply

    monkeypatch.setattr(rule, "on_push", recording)
    workers = [Worker(rank, LocalTransport(core), tiny_model(),
                      sleepy_batches(PER_SAMPLE_S * factor, rank), "lbbsp", protocol_params=params,
                      lr=0.1) for rank, factor in enumerate(factors)]
    await asyncio.gather(*(w.run() for w in workers))
    await core.close()
    return core, pushes


async def test_static_slowdowns_1_2_4_converge_to_equal_finish_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    params = LbbspParams(global_batch=112)
    core, pushes = await run_sleepy([1.0, 2.0, 4.0], params, 4.0, monkeypatch)
    versions = core.store.version
    assert versions >= 15
    rounds: dict[int, dict[int, tuple[int, float]]] = {}
    for version, worker, samples, seconds in pushes:
        rounds.setdefault(version, {})[worker] = (samples, seconds)
    for commit in core.store.commits:
        assert sorted(w for w, _ in commit.contributions) == [0, 1, 2]
        assert sum(s for s, _ in rounds[commit.version - 1].values()) == 112

    def spread(version: int) -> float:
        times = [t for _, t in rounds[version].values()]
        return (max(times) - min(times)) / max(times)

    # equal batches at first: the 4x slower worker took about 4x as long
    assert spread(0) > 0.4
    last = range(versions - 10, versions)
    # sizes settled at the balanced 64 : 32 : 16 (+- noise of the measured speeds)
    sizes = [[rounds[v][w][0] for w in range(3)] for v in last]
    for w, ideal in enumerate([64, 32, 16]):
        assert abs(statistics.median(row[w] for row in sizes) - ideal) <= 3, sizes
    assert statistics.median(spread(v) for v in last) < 0.1
    per_worker = [statistics.median(rounds[v][w][1] for v in last) for w in range(3)]
    assert (max(per_worker) - min(per_worker)) / max(per_worker) < 0.1, per_worker


def test_bad_params_name_the_parameter() -> None:
    cases: list[tuple[str, Any]] = [("global_batch", -1), ("min_batch", 0),
                                    ("max_batch", -1), ("smoothing", 1.0)]
    for key, value in cases:
        with pytest.raises(ValueError, match=rf"^{key}:"):
            LbbspParams(**{key: value})
    with pytest.raises(ValueError, match=r"^max_batch:"):
        LbbspParams(min_batch=8, max_batch=4)
    store = ParameterStore(torch.zeros(4), 3, FlatSGD(0.1))
    with pytest.raises(ValueError, match=r"^global_batch:"):
        LbbspServer(LbbspParams(global_batch=5, min_batch=2), store)


async def test_lbbsp_over_http() -> None:
    core, finals = await run_http("lbbsp", workers=3, params=LbbspParams(global_batch=48),
                                  time_s=1.0)
    assert core.store.version > 5
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert sum(f["samples"] for f in finals) >= 48 * core.store.version
    assert core.evals and core.evals[-1].accuracy > 0.5


def recording_batches(seed: int, per_sample_s: float, short_every: int = 0
                      ) -> tuple[BatchSource, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A batch source costing `per_sample_s` per sample that records every batch it returns;
    with `short_every`, every such batch holds one sample fewer than asked (a source at the
    end of its data)."""
    x, y = tiny_data()
    gen = torch.Generator().manual_seed(seed)
    returned: list[tuple[torch.Tensor, torch.Tensor]] = []

    def next_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(size * per_sample_s)
        if short_every and (len(returned) + 1) % short_every == 0 and size > 1:
            size -= 1
        idx = torch.randint(len(y), (size,), generator=gen)
        returned.append((x[idx], y[idx]))
        return x[idx], y[idx]

    return next_batch, returned


async def test_degenerate_lbbsp_is_large_batch_sgd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed lr, no momentum: each version is one plain SGD step on the mean cross-entropy of
    the union of that round's batches, whatever sizes the workers were assigned."""
    lr, steps = 0.1, 12
    params = LbbspParams(global_batch=36)
    core = build_core(tiny_model(), "lbbsp", 3, ServerSettings(lr=lr), protocol_params=params)
    rule = core.rule
    assert isinstance(rule, LbbspServer)
    pushed: dict[tuple[int, int], int] = {}  # (worker, base version) -> samples
    original = rule.on_push

    async def recording(push: Push) -> dict[str, Any]:
        reply = await original(push)
        assert (push.worker, push.base_version) not in pushed
        pushed[push.worker, push.base_version] = push.samples
        return reply

    monkeypatch.setattr(rule, "on_push", recording)
    # per-sample costs 1 : 2 : 4 make the assigned sizes differ; worker 2 runs short at times
    sources = [recording_batches(0, 0.0005), recording_batches(1, 0.001),
               recording_batches(2, 0.002, short_every=3)]
    workers = [Worker(rank, LocalTransport(core), tiny_model(), source, "lbbsp",
                      protocol_params=params, lr=lr, momentum=0.0, device="cpu",
                      seam=ThreadedWorkerSeam(StaticSlowdown(1.0)), max_steps=steps)
               for rank, (source, _) in enumerate(sources)]
    finals = await run_workers(core, workers)
    assert [f["steps"] for f in finals] == [steps] * 3
    assert core.store.version == steps
    recorded = [batches for _, batches in sources]
    assert [len(batches) for batches in recorded] == [steps] * 3

    # which batches made which version: one gradient per worker per version, based on the
    # version before, and worker w's k-th batch made its k-th push
    commits = list(core.store.commits)
    assert [c.version for c in commits] == list(range(1, steps + 1))
    rounds: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    for commit in commits:
        base = commit.version - 1
        assert sorted(commit.contributions) == [(w, base) for w in range(3)], commit
        batches = [recorded[w][base] for w, _ in commit.contributions]
        assert [pushed[w, base] for w, _ in commit.contributions] == [
            len(y) for _, y in batches]
        rounds.append(batches)
    sizes = [[len(y) for _, y in batches] for batches in rounds]
    assert any(len(set(row)) > 1 for row in sizes), sizes  # the weighting mattered
    assert any(sum(row) < 36 for row in sizes), sizes  # and a short batch counted as such

    torch.testing.assert_close(core.store.w, sgd_reference(rounds, lr, union=True),
                               rtol=0, atol=1e-6)
    # the plain mean of the workers' gradients (BSP's step) lands elsewhere
    assert not torch.allclose(core.store.w, sgd_reference(rounds, lr, union=False), atol=1e-5)


def sgd_reference(rounds: list[list[tuple[torch.Tensor, torch.Tensor]]], lr: float,
                  union: bool) -> torch.Tensor:
    """The flat parameters after one `torch.optim.SGD` step per round from the initial
    model: on the mean cross-entropy of the union of the round's batches, or (not `union`)
    on the plain mean of the batches' mean losses."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    for batches in rounds:
        optimizer.zero_grad()
        if union:
            inputs = torch.cat([x for x, _ in batches])
            targets = torch.cat([y for _, y in batches])
            loss = F.cross_entropy(model(inputs), targets)
        else:
            loss = torch.stack([F.cross_entropy(model(x), y) for x, y in batches]).mean()
        torch.autograd.backward(loss)
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_an_iterable_batch_source_is_refused() -> None:
    x, y = tiny_data()
    core = build_core(tiny_model(), "lbbsp", 1)
    fixed = [(x[:8], y[:8]), (x[8:16], y[8:16])]
    with pytest.raises(ValueError, match="callable"):
        Worker(0, LocalTransport(core), tiny_model(), fixed, "lbbsp", device="cpu")
    # a protocol that keeps batch sizes takes the same iterable
    Worker(0, LocalTransport(build_core(tiny_model(), "bsp", 1)), tiny_model(), fixed, "bsp",
           device="cpu")
