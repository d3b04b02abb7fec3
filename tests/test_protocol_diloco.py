"""DiLoCo: the outer Nesterov step on the mean pseudo-gradient, by hand; the worker's
pseudo-gradient; a run over HTTP.

`FakeContext` (a scripted `WorkerContext`) is shared with the overlap_local_sgd and
streaming_diloco tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.engine.worker import RunStopped, WorkerContext
from asyncsync.optim import FlatSGD
from asyncsync.protocols.base import Pull, Push
from asyncsync.protocols.diloco import DilocoParams, DilocoServer, DilocoWorker
from asyncsync.trainer import StepResult
from asyncsync.wire import WireError
from tests.helpers import run_http, run_local


class FakeTrainer:
    """A flat vector only."""

    def __init__(self, numel: int) -> None:
        self.flat = torch.zeros(numel)
        self.numel = numel

    def vector_copy(self) -> torch.Tensor:
        return self.flat.clone()

    def load(self, vector: torch.Tensor) -> None:
        self.flat.copy_(vector)


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
class FakeContext:
    """A `WorkerContext` stand-in: each local step adds 1 to every element and takes 1 ms;
    pull `n` answers ``reply(n, meta)`` at version n + 1, once `lag` more local steps have
    run (so a loop that waits for its own pull before stepping never gets an answer); the
    `fail_push`-th push raises `RunStopped`; stepping past `max_steps` raises `RunStopped`;
    a query answers that the exchange schedule stands at `start_step`."""

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
    sent: list[Sent] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    adopted: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    trainer: FakeTrainer = field(init=False)

    def __post_init__(self) -> None:
        self.trainer = FakeTrainer(self.numel)

    def as_context(self) -> WorkerContext:
        return cast(WorkerContext, self)

    async def steps(self, count: int = 1, batch_size: int | None = None) -> StepResult:
        if self.done >= self.max_steps:
            raise RunStopped
        for _ in range(count):
            await asyncio.sleep(0.001)
            self.trainer.flat.add_(1)
            self.done += 1
        return StepResult(0.5, 16 * count, 0.001 * count)

    async def query(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Where the exchange schedule stands (what streaming DiLoCo asks at its start)."""
        return {"step": self.start_step}

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

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

    async def adopt(self, vector: torch.Tensor, version: int) -> None:
        self.trainer.load(vector)
        self.version = version
        self.adopted.append((vector.clone(), version))


def make_store(vector: torch.Tensor, workers: int) -> ParameterStore:
    """A store whose `workers` ranks are all in the run."""
    store = ParameterStore(vector, workers, FlatSGD(0.1))
    store.live.update(range(workers))
    return store


async def outer_round(rule: DilocoServer, grads: list[torch.Tensor],
                      meta: dict[str, Any] | None = None) -> list[tuple[torch.Tensor, int]]:
    """Every worker pushes its pseudo-gradient and pulls; returns the pull replies."""
    base = rule.store.version
    for worker, grad in enumerate(grads):
        await rule.on_push(Push(worker, base, "gradient", grad, 5, 80, dict(meta or {})))
    replies = [await rule.on_pull(Pull(worker, base, dict(meta or {})))
               for worker in range(len(grads))]
    out = []
    for reply in replies:
        assert reply.vector is not None and reply.version is not None
        out.append((reply.vector.clone(), reply.version))
    return out


async def test_outer_nesterov_step_matches_a_hand_computation() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(6, generator=gen)
    store = make_store(w0.clone(), 3)
    rule = DilocoServer(DilocoParams(), store)
    lr, mu = 0.7, 0.9
    rounds = [[torch.randn(6, generator=gen) for _ in range(3)] for _ in range(2)]

    # the pull of a worker whose round is incomplete waits
    await rule.on_push(Push(0, 0, "gradient", rounds[0][0], 5, 80))
    waiting = asyncio.create_task(rule.on_pull(Pull(0, 0)))
    await asyncio.sleep(0.02)
    assert not waiting.done() and store.version == 0
    with pytest.raises(WireError) as dup:
        await rule.on_push(Push(0, 0, "gradient", rounds[0][0], 5, 80))
    assert dup.value.status == 409
    for worker in (1, 2):
        await rule.on_push(Push(worker, 0, "gradient", rounds[0][worker], 5, 80))
    first = await waiting
    assert first.version == 1

    # by hand, in float64: buf <- mu buf + g; w <- w - lr (g + mu buf)
    mean = torch.stack(rounds[0]).double().mean(dim=0)
    buf = mean.clone()
    w = w0.double() - lr * (mean + mu * buf)
    assert first.vector is not None
    assert torch.allclose(first.vector.double(), w, atol=1e-6)

    replies = await outer_round(rule, rounds[1])
    mean = torch.stack(rounds[1]).double().mean(dim=0)
    buf = mu * buf + mean
    w = w - lr * (mean + mu * buf)
    for vector, version in replies:
        assert version == 2
        assert torch.allclose(vector.double(), w, atol=1e-6)
    assert torch.allclose(store.w.double(), w, atol=1e-6)
    # each version took exactly the three pseudo-gradients of its round, none stale
    assert [sorted(c.contributions) for c in store.commits] == [
        [(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1), (2, 1)]]
    assert store.staleness.maximum == 0


async def test_zero_outer_momentum_is_plain_outer_sgd() -> None:
    store = make_store(torch.ones(4), 2)
    rule = DilocoServer(DilocoParams(outer_lr=1.0, outer_momentum=0.0), store)
    grads = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 2.0, 1.0, 0.0])]
    for _ in range(2):
        await outer_round(rule, grads)
    assert torch.allclose(store.w, torch.ones(4) - 2 * torch.full((4,), 2.0))


async def test_pull_before_push_is_refused() -> None:
    rule = DilocoServer(DilocoParams(), make_store(torch.zeros(3), 2))
    with pytest.raises(WireError) as err:
        await rule.on_pull(Pull(1, 0))
    assert err.value.status == 409


async def test_worker_pushes_global_minus_local_and_adopts_the_answer() -> None:
    def reply(number: int, meta: dict[str, Any]) -> torch.Tensor:
        return torch.full((3,), 10.0 * (number + 1))

    ctx = FakeContext(3, max_steps=12, reply=reply)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(DilocoWorker(DilocoParams(inner_steps=4)).run(ctx.as_context()),
                               5)
    # start at 0; 4 steps -> 4; g = 0 - 4. Adopt 10; 4 steps -> 14; g = 10 - 14. And so on.
    assert [s.step for s in ctx.sent] == [4, 8, 12]
    assert [s.vector.tolist() for s in ctx.sent] == [[-4.0] * 3] * 3
    assert all(s.kind == "gradient" and s.steps == 4 and s.samples == 64 for s in ctx.sent)
    assert [s.base_version for s in ctx.sent] == [0, 1, 2]
    assert [version for _, version in ctx.adopted] == [1, 2, 3]
    assert ctx.trainer.flat.tolist() == [30.0] * 3


async def test_diloco_run_every_version_is_one_full_round() -> None:
    core, finals = await run_local("diloco", [0.0, 0.002, 0.004],
                                   params=DilocoParams(inner_steps=5), max_steps=60)
    commits = core.store.commits
    assert len(commits) >= 8
    for commit in commits:
        assert sorted(worker for worker, _ in commit.contributions) == [0, 1, 2]
    assert core.store.staleness.maximum == 0
    # workers only ever stop between inner steps of a round: H steps per version
    assert all(f["steps"] in (5 * len(commits), 5 * len(commits) + 5) for f in finals)


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
