"""The engine's own rules: refusing pushes from before a rejoin (once, for every protocol),
bounded waits, and rule state that survives a resume."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.checkpoint import CheckpointError
from asyncsync.engine.compute import InlineServerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import (
    BadRequest,
    Forbidden,
    NotInRun,
    OutOfStep,
    RunStopped,
    Unacceptable,
)
from asyncsync.protocols.rounds import average
from asyncsync.protocols.wbsp import WbspParams
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.training.optim import FlatSGD
from tests.helpers import keep_every_commit, tiny_model

RUN = "run"
T = TypeVar("T")


SESSIONS: dict[int, str] = {}
"""Each rank's session secret from its latest join (a test joins before it sends)."""


def header(worker: int, **fields: Any) -> dict[str, Any]:
    return {"run_id": RUN, "worker": worker, "meta": {}, "session": SESSIONS.get(worker, ""),
            **fields}


async def join(core: ServerCore, worker: int) -> None:
    reply, _ = await core.handle("join", header(worker), None)
    SESSIONS[worker] = reply["meta"]["session"]


def push(worker: int, base: int, kind: str) -> dict[str, Any]:
    return header(worker, kind=kind, base_version=base, steps=1, samples=8)


async def join_all(core: ServerCore, workers: int) -> None:
    SESSIONS.clear()
    await asyncio.gather(*(join(core, w) for w in range(workers)))


@pytest.mark.parametrize(("protocol", "kind", "params"), [
    ("asp", "gradient", None), ("ssp", "gradient", None), ("fedasync", "model", None),
    ("wbsp", "delta", WbspParams(slow_worker=1)),
])
async def test_a_push_from_before_a_rejoin_is_refused_by_the_engine(
        protocol: str, kind: str, params: Any) -> None:
    core = build_core(tiny_model(), protocol, 2, ServerSettings(worker_timeout_s=None),
                      protocol_params=params)
    numel = core.store.numel
    try:
        await join_all(core, 2)
        await core.handle("push", push(1, 0, kind), torch.zeros(numel))
        assert core.store.version == 1
        await join(core, 0)  # worker 0 re-syncs (as after a refusal): it rejoins at 1
        w = core.store.w
        with pytest.raises(OutOfStep, match="rejoined at version 1"):
            await core.handle("push", push(0, 0, kind), torch.ones(numel))
        assert core.store.version == 1 and core.store.w is w
        await core.handle("push", push(0, 1, kind), torch.zeros(numel))
        await core.handle("push", push(1, 1, kind), torch.zeros(numel))
        assert core.store.version >= 2
    finally:
        await core.stop()
        await core.close()


async def test_a_wait_ends_when_its_worker_is_dropped() -> None:
    store = ParameterStore(torch.zeros(4), 2, FlatSGD(0.1))
    store.live.update({0, 1})
    waiting = asyncio.create_task(store.wait_for(lambda: False, 1))
    await asyncio.sleep(0)
    store.live.discard(1)
    store.notify()
    with pytest.raises(NotInRun):
        await asyncio.wait_for(waiting, 5)


async def test_a_notify_resumes_only_the_held_requests_whose_condition_holds() -> None:
    """An idle held request (a FedAvg worker not sampled) is not resumed at each notify:
    its condition is checked outside its task, and it waits on; a request whose condition
    holds goes on, and a stopping run ends the rest."""
    store = ParameterStore(torch.zeros(4), 3, FlatSGD(0.1))
    store.live.update({0, 1, 2})
    checked_in: list[asyncio.Task[Any] | None] = []
    drawn = [False]

    def idle() -> bool:
        checked_in.append(asyncio.current_task())
        return False

    held = asyncio.create_task(store.wait_for(idle, 1))
    drawn_pull = asyncio.create_task(store.wait_for(lambda: drawn[0], 2))
    await asyncio.sleep(0)
    assert checked_in == [held, held]  # on arrival, then at the top of its loop
    for _ in range(5):
        store.notify()
        store.notify()  # one check for both
        await asyncio.sleep(0)
    assert checked_in[2:] == [None] * 5 and not held.done()
    drawn[0] = True
    store.notify()
    await asyncio.wait_for(drawn_pull, 5)
    assert not held.done() and store.held == {1}
    store.stop()
    with pytest.raises(RunStopped):
        await asyncio.wait_for(held, 5)
    assert store.held == set()


async def test_wbsp_continues_from_the_resumed_model(tmp_path: Any) -> None:
    """After a resume, the first published version builds on the checkpointed model (it
    used to build on the initial one, throwing the resumed model away)."""
    settings = ServerSettings(checkpoint_path=tmp_path / "checkpoint.npz",
                              worker_timeout_s=None)
    params = WbspParams(slow_worker=0)
    first = build_core(tiny_model(), "wbsp", 1, settings, protocol_params=params)
    delta = torch.full((first.store.numel,), 0.5)
    await join_all(first, 1)
    await first.handle("push", push(0, 0, "delta"), delta)
    saved = first.store.w.clone()
    await first.stop()  # writes the final checkpoint
    await first.close()

    second = build_core(tiny_model(), "wbsp", 1, settings, protocol_params=params)
    try:
        second.resume(settings.checkpoint_path)  # type: ignore[arg-type]
        assert torch.equal(second.store.w, saved) and second.store.version == 1
        SESSIONS.clear()  # the sessions of the first server ended with it
        await join(second, 0)
        await second.handle("push", push(0, 1, "delta"), delta)
        assert second.store.version == 2
        torch.testing.assert_close(second.store.w, saved + delta)
    finally:
        await second.stop()
        await second.close()


class GatedEvaluations(InlineServerSeam):
    """Evaluations wait for `gate` once the run is stopping (a slow final evaluation)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.stopping = lambda: False

    async def evaluate(self, fn: Callable[..., T], *args: Any) -> T:
        if self.stopping():
            await self.gate.wait()
        return fn(*args)


async def until(ready: Callable[[], bool], deadline_s: float = 60.0) -> None:
    """Poll `ready` until it holds; fail after `deadline_s` (generous: a busy CI host)."""

    async def poll() -> None:
        while not ready():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), deadline_s)


async def test_a_run_ended_by_its_budget_finishes_when_its_workers_leave() -> None:
    """Workers that leave during the budget's final evaluation still finish the run (the
    budget used to stop the run without checking whether everyone had left)."""
    seam = GatedEvaluations()
    x = torch.randn(64, 8)
    core = build_core(tiny_model(), "asp", 1, ServerSettings(time_s=0.2, eval_interval_s=60),
                      test_data=(x, (x[:, 0] > 0).long()), seam=seam)
    seam.stopping = lambda: core.store.stopping
    try:
        await join_all(core, 1)
        numel = core.store.w.numel()  # a new version, so the stop evaluates it
        await core.handle("push", push(0, 0, "gradient"), torch.zeros(numel))
        await until(lambda: core.store.stopping)
        await core.handle("leave", header(0), None)
        assert not core.run.stopped and not core.finished.is_set()
        seam.gate.set()  # the final evaluation ends
        await asyncio.wait_for(core.finished.wait(), 10)
    finally:
        await core.close()


async def test_a_failing_checkpoint_is_logged_counted_and_retried(tmp_path: Any) -> None:
    """A checkpoint path that became a directory: each write fails, is counted, leaves no
    temporary file, and the run goes on; once writable again, the next period writes it;
    a failing final write does not keep the run from stopping."""
    path = tmp_path / "checkpoint.npz"
    events = tmp_path / "events.jsonl"
    core = build_core(tiny_model(), "asp", 1, ServerSettings(
        checkpoint_path=path, checkpoint_s=0.05, worker_timeout_s=None),
        events=JsonlLog(events))
    try:
        path.mkdir()
        await join_all(core, 1)
        await until(lambda: core.run.checkpoint_failures >= 2)
        assert not core.store.stopping and core.status()["checkpoint_failures"] >= 2
        assert not (tmp_path / "checkpoint.npz.tmp").exists()
        await core.handle("push", push(0, 0, "gradient"), torch.zeros(core.store.numel))
        path.rmdir()
        await until(path.is_file)
        with np.load(path, allow_pickle=False) as saved:
            assert int(saved["version"]) == 1
        while not path.is_dir():  # the final write fails too (a periodic write in its
            path.unlink(missing_ok=True)  # thread may land between the two calls: again)
            with contextlib.suppress(FileExistsError):
                path.mkdir()
        await asyncio.wait_for(core.stop(), 10)
        await core.handle("leave", header(0), None)
        assert core.finished.is_set()
    finally:
        await core.close()
    logged = [r[KEY] for r in read_jsonl(events)]
    assert Kind.CHECKPOINT_FAILED in logged and Kind.CHECKPOINT in logged
    assert logged[-1] == "stop"


async def test_a_token_holder_cannot_act_as_another_rank() -> None:
    """Sessions: a forged join for a live rank is refused and withdraws nothing; requests
    without the rank's secret (leave, push, pull, heartbeat) are forbidden."""
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(worker_timeout_s=None))
    numel = core.store.numel
    try:
        await join_all(core, 2)
        await core.handle("push", push(0, 0, "gradient"), torch.ones(numel))
        honest = SESSIONS[0]
        forged = {"run_id": RUN, "worker": 0, "meta": {}, "session": "guess"}
        with pytest.raises(OutOfStep, match="live session"):
            await core.handle("join", forged, None)
        for op in ("leave", "heartbeat", "pull", "push"):
            with pytest.raises(Forbidden, match="session secret"):
                await core.handle(op, {**push(0, 0, "gradient"), "session": "guess"},
                                  torch.ones(numel))
        assert SESSIONS[0] == honest and 0 in core.store.live
        # worker 0's acknowledged push still counts: worker 1's push closes the round
        await core.handle("push", push(1, 0, "gradient"), torch.ones(numel))
        assert core.store.version == 1
        # once the session has left, a new one may take the rank
        await core.handle("leave", header(0), None)
        reply, _ = await core.handle("join", forged, None)
        assert reply["meta"]["session"] != honest
    finally:
        await core.stop()
        await core.close()


async def test_nothing_commits_before_every_worker_has_joined() -> None:
    """A joined worker waiting at the start barrier cannot push (bsp used to commit a
    version with one of four workers before the others had joined)."""
    core = build_core(tiny_model(), "bsp", 4, ServerSettings(worker_timeout_s=None))
    try:
        waiting = asyncio.create_task(core.handle("join", header(0), None))
        await asyncio.sleep(0.01)
        secret = core.workers[0].session  # as a client reading it off the wire would not
        for op in ("push", "pull"):
            with pytest.raises(OutOfStep, match="not started"):
                await core.handle(op, {**push(0, 0, "gradient"), "session": secret},
                                  torch.ones(core.store.numel))
        assert core.store.version == 0 and not waiting.done()
        await asyncio.gather(*(join(core, w) for w in (1, 2, 3)))
        await waiting
    finally:
        await core.stop()
        await core.close()


BIG = 3e38  # finite in float32 (max 3.4e38), but two of them add up to Inf


async def test_finite_pushes_that_add_up_to_inf_leave_the_bsp_model_finite() -> None:
    """The attack of the hardening issue: two of four bsp workers push 3e38 everywhere.
    Their mean used to be summed in float32 (Inf) and made every parameter -Inf."""
    core = build_core(tiny_model(), "bsp", 4, ServerSettings(worker_timeout_s=None))
    numel = core.store.numel
    try:
        await join_all(core, 4)
        for worker in range(4):
            vector = torch.full((numel,), BIG) if worker < 2 else torch.zeros(numel)
            await core.handle("push", push(worker, 0, "gradient"), vector)
        assert core.store.version == 1
        assert bool(torch.isfinite(core.store.w).all())
    finally:
        await core.stop()
        await core.close()


async def test_a_push_whose_result_would_be_inf_is_refused_and_changes_nothing() -> None:
    """asp at lr 1 with momentum: the second 3e38 gradient would make the model and the
    momentum buffer Inf; it is refused and neither changes."""
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None, lr=1.0,
                                                             momentum=0.5))
    numel = core.store.numel
    try:
        await join_all(core, 1)
        await core.handle("push", push(0, 0, "gradient"), torch.full((numel,), -BIG))
        w, buffer = core.store.w.clone(), core.store.optimizer.momentum_buffer
        assert buffer is not None and bool(torch.isfinite(w).all())
        buffer = buffer.clone()
        with pytest.raises(Unacceptable, match="non-finite"):
            await core.handle("push", push(0, 1, "gradient"), torch.full((numel,), -BIG))
        assert core.store.version == 1 and torch.equal(core.store.w, w)
        assert torch.equal(core.store.optimizer.momentum_buffer, buffer)  # type: ignore[arg-type]
    finally:
        await core.stop()
        await core.close()


async def test_a_round_whose_result_would_be_inf_is_discarded() -> None:
    """local_sgd adds the round's mean delta (through its server optimizer): a second round
    of 3e38 deltas would overflow. The round is discarded: its version publishes the
    unchanged model, so nobody waits."""
    core = keep_every_commit(build_core(tiny_model(), "local_sgd", 2,
                                        ServerSettings(worker_timeout_s=None)))
    numel = core.store.numel
    try:
        await join_all(core, 2)
        for version in (0, 1):
            for worker in range(2):
                await core.handle("push", push(worker, version, "delta"),
                                  torch.full((numel,), BIG))
            if version == 0:
                first = core.store.w.clone()
        assert core.store.version == 2 and torch.equal(core.store.w, first)
        assert bool(torch.isfinite(first).all())
        assert [r.refused for r in core.rule.rounds] == [False, True]  # type: ignore[attr-defined]
    finally:
        await core.stop()
        await core.close()


async def test_a_push_claiming_more_samples_than_its_steps_can_hold_is_refused() -> None:
    core = build_core(tiny_model(), "fedavg", 1, ServerSettings(worker_timeout_s=None,
                                                                max_batch=64))
    try:
        await join_all(core, 1)
        heavy = {**push(0, 0, "delta"), "steps": 2, "samples": 129}
        with pytest.raises(Unacceptable, match="max_batch"):
            await core.handle("push", heavy, torch.zeros(core.store.numel))
        assert core.store.version == 0
    finally:
        await core.stop()
        await core.close()


async def checkpointed_core(tmp_path: Any) -> ServerSettings:
    """Run a one-worker asp core long enough to write its final checkpoint."""
    settings = ServerSettings(checkpoint_path=tmp_path / "checkpoint.npz",
                              worker_timeout_s=None)
    core = build_core(tiny_model(), "asp", 1, settings)
    await join_all(core, 1)
    await core.stop()
    await core.close()
    return settings


def rewrite(path: Any, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    change(arrays)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


async def test_a_checkpoint_of_another_model_with_as_many_parameters_is_refused(
        tmp_path: Any) -> None:
    settings = await checkpointed_core(tmp_path)
    other = torch.nn.Linear(177, 1)  # 178 values, as many as tiny_model's
    assert sum(p.numel() for p in other.parameters()) == build_core(
        tiny_model(), "asp", 1).store.numel
    with pytest.raises(CheckpointError) as refused:
        build_core(other, "asp", 1, settings).resume(settings.checkpoint_path)  # type: ignore[arg-type]
    assert "is of another model (weight:[1, 177]:float32 here, 0.weight:[16, 8]:float32 in " \
        "the checkpoint)" in str(refused.value)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda a: a.update(w=a["w"].astype(np.float64)), "178 values of torch.float64"),
    (lambda a: a.pop("version"), "lacks version"),
    (lambda a: a.pop("fingerprint"), "lacks fingerprint"),
])
async def test_a_damaged_checkpoint_is_refused_with_a_clear_message(
        tmp_path: Any, change: Callable[[dict[str, np.ndarray]], None], problem: str) -> None:
    settings = await checkpointed_core(tmp_path)
    rewrite(settings.checkpoint_path, change)
    core = build_core(tiny_model(), "asp", 1, settings)
    with pytest.raises(CheckpointError, match=problem):
        core.resume(settings.checkpoint_path)  # type: ignore[arg-type]
    assert core.store.version == 0


async def test_a_fused_exchange_answers_with_the_model_of_the_round_it_closed() -> None:
    """bsp, two workers: worker 0's push with ``then_pull`` waits at the barrier and is
    answered with version 1, ``w0 - lr * mean(g0, g1)``, its push's meta beside."""
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(lr=0.1, worker_timeout_s=None))
    await join_all(core, 2)
    numel, w0 = core.store.numel, core.store.w.clone()
    fused = asyncio.create_task(core.handle(
        "push", {**push(0, 0, "gradient"), "then_pull": True}, torch.full((numel,), 1.0)))
    for _ in range(100):
        if 0 in core.store.held:
            break
        await asyncio.sleep(0)
    assert 0 in core.store.held and not fused.done()
    await core.handle("push", push(1, 0, "gradient"), torch.full((numel,), 3.0))
    reply, vector = await fused
    assert reply["version"] == 1
    assert reply["meta"]["push"] == {"fragment": 0, "round": 0}
    assert vector is not None and torch.allclose(vector, w0 - 0.1 * 2.0)
    with pytest.raises(BadRequest, match="then_pull"):
        await core.handle("push", {**push(0, 1, "gradient"), "then_pull": "yes"},
                          torch.zeros(numel))
    assert core.store.version == 1


@pytest.mark.parametrize(("momentum", "weight_decay", "nesterov"),
                         [(0.0, 0.0, False), (0.9, 0.0, False), (0.9, 1e-2, True)])
def test_the_servers_one_pass_step_matches_the_optimizer(
        momentum: float, weight_decay: float, nesterov: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    w, g = torch.randn(50, generator=gen), torch.randn(50, generator=gen)
    reference = FlatSGD(0.1, momentum, weight_decay, nesterov)
    fused = FlatSGD(0.1, momentum, weight_decay, nesterov)
    for _ in range(3):
        expected = w - reference.update(w, g)
        out = torch.empty(50)
        fused.momentum_buffer = fused.apply_into(out, w, g)
        assert torch.allclose(out, expected, atol=1e-6)
        w = expected


def test_averaging_in_place_overwrites_the_first_vector_with_the_mean() -> None:
    vectors = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])]
    first = vectors[0]
    mean = average(vectors, [1.0, 3.0], in_place=True)
    assert mean is first
    assert torch.equal(mean, torch.tensor([2.5, 5.0]))
    single = torch.tensor([4.0])
    assert average([single], in_place=True) is single and single.item() == 4.0
    assert average([torch.tensor([1.0]), torch.tensor([2.0])]).item() == 1.5


def test_a_join_reply_holds_for_the_time_the_start_barrier_held_it() -> None:
    """The run's clock starts (from 0) at the last join: a first joiner's held time is
    measured across that start, and must still be the time it waited, never negative."""

    async def run() -> list[float]:
        SESSIONS.clear()
        core = build_core(tiny_model(), "asp", 2, ServerSettings(worker_timeout_s=None),
                          seam=InlineServerSeam())
        await asyncio.sleep(5.0)  # the server is up 5 s before the first join
        first = asyncio.create_task(core.handle("join", header(0), None))
        await asyncio.sleep(2.0)  # the first joiner is held 2 s, until the last joins
        second, _ = await core.handle("join", header(1), None)
        held = [(await first)[0]["meta"]["held_s"], second["meta"]["held_s"]]
        await core.stop()
        await core.close()
        return held

    loop = VirtualTimeLoop()
    try:
        held = loop.run_until_complete(run())
    finally:
        loop.close()
    assert held == [pytest.approx(2.0), 0.0]


def test_a_barriers_history_holds_a_bounded_number_of_worker_entries() -> None:
    """256 commits of a 100,000-worker barrier would name 25.6 million contributions: the
    store and the round barrier keep fewer records as the run names more workers."""
    from asyncsync.protocols.bsp import BspParams, BspServer

    for workers, kept in [(3, 256), (4096, 256), (100_000, 10), (10_000_000, 8)]:
        store = ParameterStore(torch.zeros(4), workers, FlatSGD(0.1), seam=InlineServerSeam())
        rule = BspServer(BspParams(), store)
        assert (store.commits.maxlen, rule.rounds.maxlen) == (kept, kept), workers
