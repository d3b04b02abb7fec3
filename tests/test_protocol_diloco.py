"""DiLoCo: the outer Nesterov step on the negated mean delta, by hand; buffers take the
workers' mean, never the outer step; the worker's delta; a run over HTTP.

`FakeContext` (a scripted implementation of the SDK's `Context` port) is shared with the
overlap_local_sgd, streaming_diloco and membership tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import torch

from asyncsync.protocols.base import OutOfStep, Pull, Push, Refused, RunStopped
from asyncsync.protocols.diloco import DilocoParams, DilocoServer, DilocoWorker
from asyncsync.protocols.ports import Context, StepResult
from asyncsync.protocols.testing import FakeStore
from tests.helpers import run_http, run_local

T = TypeVar("T")


@dataclass
class Sent:
    """One push as the fake server saw it."""

    step: int
    kind: str
    vector: torch.Tensor
    steps: int
    samples: int
    base_version: int
    meta: dict[str, Any]


@dataclass
class Answer:
    """One pull: the step count when it was sent and when it was answered."""

    asked: int
    answered: int
    meta: dict[str, Any]


@dataclass
class Mix:
    """One `mix_toward` call: after which local step, on which slice, with which weight."""

    step: int
    start: int
    stop: int
    weight: float
    target: torch.Tensor


@dataclass
class FakeContext:
    """A scripted `Context`: the local model is the flat vector `local` (zeros at first).

    Each local step adds 1 to every element of `local` and takes 1 ms; stepping once
    `max_steps` steps are done raises `RunStopped` (a block already begun finishes). Pull
    `n` answers ``reply(n, meta)`` at version n + 1, once `lag` more local steps have run
    (so a loop that waits for its own pull before stepping never gets an answer); the
    `fail_push`-th push raises `RunStopped`; a query answers that the exchange schedule
    stands at `start_step`. Pushes, pull answers, adoptions and mixes are recorded.
    """

    numel: int
    max_steps: int
    reply: Callable[[int, dict[str, Any]], torch.Tensor]
    lag: int = 0
    fail_push: int | None = None
    start_step: int = 0
    done: int = 0
    version: int = 0
    rank: int = 0
    workers: int = 1
    batch_size: int = 16
    lr: float = 1.0
    sent: list[Sent] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    adopted: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    mixes: list[Mix] = field(default_factory=list)
    local: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.local = torch.zeros(self.numel)

    def as_context(self) -> Context:
        return self  # type-checked against the port

    def _stop_if_spent(self) -> None:
        if self.done >= self.max_steps:
            raise RunStopped

    # ---- computation -------------------------------------------------------------------
    async def gradient(self, batch_size: int | None = None, *, copy: bool = True,
                       ) -> tuple[StepResult, torch.Tensor]:
        """The gradient of a step that adds 1 (at lr 1): -1 everywhere; not a local step."""
        self._stop_if_spent()
        await asyncio.sleep(0.001)
        return StepResult(0.5, batch_size or self.batch_size, 0.001), -torch.ones(self.numel)

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        assert proximal is None and correction is None, \
            "no protocol under test here takes proximal or corrected steps"
        self._stop_if_spent()
        for _ in range(count):
            await asyncio.sleep(0.001)
            self.local.add_(1)
            self.done += 1
        return StepResult(0.5, (batch_size or self.batch_size) * count, 0.001 * count)

    async def snapshot(self) -> torch.Tensor:
        return self.local.clone()

    async def delta_since(self, anchor: torch.Tensor, start: int = 0,
                          stop: int | None = None) -> torch.Tensor:
        assert anchor.shape == (self.numel,), "the anchor is a full-length vector"
        return self.local[start:stop] - anchor[start:stop]

    async def delta_and_snapshot(self, anchor: torch.Tensor) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        return self.local - anchor, self.local.clone()

    async def mix_toward(self, target: torch.Tensor, weight: float, start: int = 0,
                         stop: int | None = None) -> None:
        part = self.local[start:stop]
        assert target.shape == part.shape, "the target holds just the slice"
        self.mixes.append(Mix(self.done, start, self.numel if stop is None else stop, weight,
                              target.clone()))
        part.mul_(1 - weight).add_(target, alpha=weight)

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        self.local.copy_(vector)
        self.version = version
        self.adopted.append((vector.clone(), version))

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    # ---- messages ----------------------------------------------------------------------
    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        self.sent.append(Sent(self.done, kind, vector.clone(), steps, samples,
                              self.version if base_version is None else base_version,
                              dict(meta or {})))
        if self.fail_push == len(self.sent):
            raise RunStopped
        return {}

    async def pull(self, meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> tuple[torch.Tensor, int, dict[str, Any]]:
        asked = self.done
        while self.done < asked + self.lag:
            await asyncio.sleep(0.0005)
        number = len(self.answers)
        self.answers.append(Answer(asked, self.done, dict(meta or {})))
        return self.reply(number, dict(meta or {})), number + 1, {}

    async def push_and_pull(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                            meta: dict[str, Any] | None = None,
                            ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        """A push, then a pull (as the engine's fused request)."""
        pushed = await self.push(kind, vector, steps, samples, meta)
        vector, version, pulled = await self.pull(meta)
        return vector, version, {**pulled, "push": pushed}

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Where the exchange schedule stands (what streaming DiLoCo asks at its start)."""
        return {"step": self.start_step}


def make_store(vector: torch.Tensor, workers: int, num_params: int | None = None
               ) -> FakeStore:
    """A store whose `workers` ranks are all in the run."""
    store = FakeStore(vector, workers, lr=0.1, num_params=num_params)
    return store


async def outer_round(rule: DilocoServer, deltas: list[torch.Tensor],
                      meta: dict[str, Any] | None = None) -> list[tuple[torch.Tensor, int]]:
    """Worker i pushes ``deltas[i]`` and every worker pulls; returns the pull replies."""
    base = rule.store.version
    for worker, delta in enumerate(deltas):
        await rule.on_push(Push(worker, base, "delta", delta, 5, 80, dict(meta or {})))
    replies = [await rule.on_pull(Pull(worker, base, dict(meta or {})))
               for worker in range(len(deltas))]
    out = []
    for reply in replies:
        assert reply.vector is not None and reply.version is not None
        out.append((reply.vector.clone(), reply.version))
    return out


def test_the_server_takes_deltas_only() -> None:
    assert DilocoServer.push_kinds == frozenset({"delta"})


async def test_outer_nesterov_step_matches_a_hand_computation() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(6, generator=gen)
    store = make_store(w0.clone(), 3)
    rule = DilocoServer(DilocoParams(), store)
    lr, mu = 0.7, 0.9
    rounds = [[torch.randn(6, generator=gen) for _ in range(3)] for _ in range(2)]

    # the pull of a worker whose round is incomplete waits
    await rule.on_push(Push(0, 0, "delta", rounds[0][0], 5, 80))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0)))
    await asyncio.sleep(0.02)
    assert not waiting.done() and store.version == 0
    with pytest.raises(Refused) as dup:
        await rule.on_push(Push(0, 0, "delta", rounds[0][0], 5, 80))
    assert isinstance(dup.value, OutOfStep)
    for worker in (1, 2):
        await rule.on_push(Push(worker, 0, "delta", rounds[0][worker], 5, 80))
    first = await waiting
    assert first.version == 1

    # by hand, in float64: g = -mean delta; buf <- mu buf + g; w <- w - lr (g + mu buf)
    g = -torch.stack(rounds[0]).double().mean(dim=0)
    buf = g.clone()
    w = w0.double() - lr * (g + mu * buf)
    assert first.vector is not None
    assert torch.allclose(first.vector.double(), w, atol=1e-6)

    replies = await outer_round(rule, rounds[1])
    g = -torch.stack(rounds[1]).double().mean(dim=0)
    buf = mu * buf + g
    w = w - lr * (g + mu * buf)
    for vector, version in replies:
        assert version == 2
        assert torch.allclose(vector.double(), w, atol=1e-6)
    assert torch.allclose(store.w.double(), w, atol=1e-6)
    # each version took exactly the three deltas of its round, none stale
    assert [sorted(c.contributions) for c in store.commits] == [
        [(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1), (2, 1)]]
    assert [sorted(r.steps) for r in rule.rounds] == [[0, 1, 2], [0, 1, 2]]
    assert all(base == c.version - 1 for c in store.commits for _, base in c.contributions)


async def test_outer_step_matches_torch_nesterov_sgd() -> None:
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(5, generator=gen)
    store = make_store(w0.clone(), 2)
    rule = DilocoServer(DilocoParams(outer_lr=0.5, outer_momentum=0.8), store)
    reference = torch.nn.Parameter(w0.double().clone())
    sgd = torch.optim.SGD([reference], lr=0.5, momentum=0.8, nesterov=True)
    for _ in range(3):
        deltas = [torch.randn(5, generator=gen) for _ in range(2)]
        await outer_round(rule, deltas)
        reference.grad = -(deltas[0].double() + deltas[1].double()) / 2
        sgd.step()
        assert torch.allclose(store.w.double(), reference.detach(), atol=1e-6)


async def test_buffers_take_the_workers_mean_not_the_outer_step() -> None:
    # four parameters, then two buffer slots: a running variance and a running mean
    lr, mu = 0.7, 0.9
    w0 = torch.tensor([0.25, -1.0, 2.0, 0.5, 0.5, 0.0])
    store = make_store(w0.clone(), 3, num_params=4)
    rule = DilocoServer(DilocoParams(outer_lr=lr, outer_momentum=mu), store)
    # the buffer parts differ per worker (values exact in binary floating point)
    deltas = [torch.tensor([0.5, 0.25, -1.0, 0.125, -0.25, 0.125]),
              torch.tensor([-0.25, 0.75, 0.5, 0.375, -0.5, -0.25]),
              torch.tensor([1.0, -0.5, 0.25, -0.125, -0.5625, 0.5])]
    replies = await outer_round(rule, deltas)

    mean = (deltas[0] + deltas[1] + deltas[2]) / 3
    buffers = w0[4:] + mean[4:]
    assert buffers.tolist() == [0.0625, 0.125]  # the workers' mean of each buffer
    for vector, version in replies:
        assert version == 1
        assert torch.equal(vector[4:], buffers)
    assert torch.equal(store.w[4:], buffers)
    assert store.w[4] > 0  # the running variance stays positive

    # the parameters: one Nesterov step on g = -mean delta, by hand in float64
    g = -torch.stack(deltas).double().mean(dim=0)
    params = w0[:4].double() - lr * (g[:4] + mu * g[:4])
    assert torch.allclose(store.w[:4].double(), params, atol=1e-6)
    # the old behaviour, the outer step on the buffers too, would have made the variance
    # negative: 0.5 - 0.7 * 1.9 * 0.4375
    stepped = w0[4:].double() - lr * (g[4:] + mu * g[4:])
    assert stepped[0] < 0 and not torch.allclose(stepped, buffers.double())
    # the outer momentum covers the parameters only
    assert rule.state_dict()["outer.0.momentum"].shape == (4,)

    # a second round: momentum carries on for the parameters; buffers are the mean again
    second = [torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0625, -0.125]),
              torch.tensor([0.0, 0.0, 0.0, 0.0, -0.0625, 0.375]),
              torch.tensor([-0.5, 0.25, 0.5, 1.0, 0.0, 0.125])]
    await outer_round(rule, second)
    assert torch.equal(store.w[4:], buffers + (second[0] + second[1] + second[2])[4:] / 3)
    g2 = -torch.stack(second).double().mean(dim=0)[:4]
    buf = mu * g[:4] + g2
    params = params - lr * (g2 + mu * buf)
    assert torch.allclose(store.w[:4].double(), params, atol=1e-6)


async def test_zero_outer_momentum_is_plain_outer_sgd() -> None:
    store = make_store(torch.ones(4), 2)
    rule = DilocoServer(DilocoParams(outer_lr=1.0, outer_momentum=0.0), store)
    deltas = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 2.0, 1.0, 0.0])]
    for _ in range(2):
        await outer_round(rule, deltas)
    # outer lr 1 without momentum: w + mean delta, the workers' mean model, twice
    assert torch.allclose(store.w, torch.ones(4) + 2 * torch.full((4,), 2.0))
    assert rule.state_dict() == {}


async def test_a_pull_before_its_push_waits_for_the_round() -> None:
    store = make_store(torch.zeros(3), 2)
    rule = DilocoServer(DilocoParams(outer_lr=1.0, outer_momentum=0.0), store)
    early = asyncio.create_task(rule.on_pull(Pull(1, 0)))
    await asyncio.sleep(0.02)
    assert not early.done()
    await outer_round(rule, [torch.ones(3), 3 * torch.ones(3)])
    reply = await asyncio.wait_for(early, 1)
    assert reply.version == 1 and reply.vector is not None
    assert torch.equal(reply.vector, torch.full((3,), 2.0))


async def test_a_push_of_another_version_is_refused() -> None:
    store = make_store(torch.zeros(3), 2)
    rule = DilocoServer(DilocoParams(), store)
    with pytest.raises(Refused) as err:
        await rule.on_push(Push(0, 1, "delta", torch.ones(3), 5, 80))
    assert isinstance(err.value, OutOfStep)
    assert store.version == 0 and not rule.pending[0]


async def test_a_lost_workers_arrived_delta_counts_in_its_round() -> None:
    store = make_store(torch.zeros(2), 3)
    rule = DilocoServer(DilocoParams(outer_lr=1.0, outer_momentum=0.0), store)
    await rule.on_push(Push(2, 0, "delta", torch.full((2,), 100.0), 5, 80))
    await rule.on_push(Push(0, 0, "delta", torch.full((2,), 1.0), 5, 80))
    await store.leave(rule, 2)  # worker 2 is lost after its delta arrived: it counts
    assert store.version == 0 and sorted(rule.pending[0]) == [0, 2]
    await rule.on_push(Push(1, 0, "delta", torch.full((2,), 3.0), 5, 80))
    # the round closed with the three deltas: w + mean(100, 1, 3)
    assert store.version == 1 and torch.allclose(store.w, torch.full((2,), 104 / 3))
    assert sorted(store.commits[-1].contributions) == [(0, 0), (1, 0), (2, 0)]
    await outer_round(rule, [torch.full((2,), 2.0), torch.full((2,), 4.0)])
    assert sorted(store.commits[-1].contributions) == [(0, 1), (1, 1)]  # worker 2 is gone
    assert torch.allclose(store.w, torch.full((2,), 104 / 3 + 3))


async def test_worker_pushes_its_delta_and_adopts_the_answer() -> None:
    def reply(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((3,), 10.0 * (number + 1))

    ctx = FakeContext(3, max_steps=12, reply=reply)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(DilocoWorker(DilocoParams(inner_steps=4)).run(ctx.as_context()),
                               5)
    # start at 0; 4 steps -> 4; d = 4 - 0. Adopt 10; 4 steps -> 14; d = 14 - 10. And so on.
    assert [s.step for s in ctx.sent] == [4, 8, 12]
    assert [s.vector.tolist() for s in ctx.sent] == [[4.0] * 3] * 3
    assert all(s.kind == "delta" and s.steps == 4 and s.samples == 64 for s in ctx.sent)
    assert [s.base_version for s in ctx.sent] == [0, 1, 2]
    assert [version for _, version in ctx.adopted] == [1, 2, 3]
    assert [v.tolist() for v, _ in ctx.adopted] == [[10.0] * 3, [20.0] * 3, [30.0] * 3]
    assert ctx.local.tolist() == [30.0] * 3


async def test_diloco_run_every_version_is_one_full_round() -> None:
    core, finals = await run_local("diloco", [0.0, 0.002, 0.004],
                                   params=DilocoParams(inner_steps=5), max_steps=60)
    commits = core.store.commits
    assert len(commits) >= 8
    for commit in commits:
        assert sorted(worker for worker, _ in commit.contributions) == [0, 1, 2]
    assert core.store.staleness.maximum == 0
    # workers only ever stop between inner steps of a round: H steps per version
    versions = core.store.version
    assert all(f["steps"] in (5 * versions, 5 * versions + 5) for f in finals)


async def test_diloco_over_http() -> None:
    core, finals = await run_http("diloco", workers=3, params=DilocoParams(inner_steps=5),
                                  time_s=1.0)
    assert core.store.version >= 3
    assert all(f["steps"] >= 15 and f["bytes_up"] > 0 for f in finals)
    assert all(len(c.contributions) == 3 for c in core.store.commits)
    assert core.evals[-1].loss < core.evals[0].loss


@pytest.mark.parametrize(("field_name", "value"), [
    ("inner_steps", 0), ("outer_lr", 0.0), ("outer_momentum", 1.0), ("outer_momentum", -0.1)])
def test_bad_parameters_name_the_parameter(field_name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field_name):
        DilocoParams(**{field_name: value})
