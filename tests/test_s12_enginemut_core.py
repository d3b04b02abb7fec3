"""The server core's checks and events, found by mutation testing of `engine.core`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.compute import InlineServerSeam
from asyncsync.engine.core import ServerCore, build_core
from asyncsync.engine.evaluation import EvalPoint
from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.base import BadRequest, Forbidden, OutOfStep, get_protocol
from asyncsync.runlog.metrics import JsonlLog
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from tests.helpers import tiny_model


@pytest.mark.parametrize("workers", [0, -2])
def test_a_core_of_no_workers_is_refused(workers: int) -> None:
    asp = get_protocol("asp")
    with pytest.raises(ValueError, match=f"workers must be an int >= 1, got {workers}"):
        ServerCore(torch.zeros(3), asp, asp.make_params(None, 1), workers, ServerSettings())


async def test_a_resumed_run_logs_its_resume_not_a_second_start(tmp_path: Path) -> None:
    settings = ServerSettings(checkpoint_path=tmp_path / "checkpoint.npz",
                              worker_timeout_s=None)
    first = build_core(tiny_model(), "asp", 1, settings,
                       events=JsonlLog(tmp_path / "first.jsonl"))
    await first.handle("join", {"run_id": "run", "worker": 0}, None)
    await first.stop()  # writes the checkpoint
    await first.close()
    second = build_core(tiny_model(), "asp", 1, settings,
                        events=JsonlLog(tmp_path / "second.jsonl"))
    second.resume(tmp_path / "checkpoint.npz")
    await second.stop()
    await second.close()
    kinds = [[e[KEY] for e in read_jsonl(tmp_path / f"{name}.jsonl")]
             for name in ("first", "second")]
    assert kinds[0].count(Kind.START) == 1 and Kind.RESUME not in kinds[0]
    assert kinds[1].count(Kind.RESUME) == 1 and Kind.START not in kinds[1]


RUN = "run"


def head(rank: int, session: str, **fields: object) -> dict[str, object]:
    return {"run_id": RUN, "worker": rank, "session": session, **fields}


async def joined(core: ServerCore) -> list[str]:
    replies = await asyncio.gather(*(core.handle("join", {"run_id": RUN, "worker": rank},
                                                 None) for rank in range(len(core.workers))))
    return [str(reply["meta"]["session"]) for reply, _ in replies]


async def test_a_stopped_run_finishes_once_its_last_worker_has_left() -> None:
    core = build_core(tiny_model(), "asp", 2, ServerSettings(worker_timeout_s=None))
    sessions = await joined(core)
    await core.stop()
    assert not core.finished.is_set() and core.status()["finished"] is False
    await core.handle("leave", head(0, sessions[0]), None)
    assert not core.finished.is_set()  # worker 1 is still in
    await core.handle("leave", head(1, sessions[1]), None)
    assert core.finished.is_set() and core.status()["finished"] is True
    await core.close()


async def test_a_leave_after_the_stop_completes_no_round() -> None:
    # BSP of 3: workers 0 and 1 have pushed, 2 has not. Once the run has stopped, 2's
    # leave does not close the round without it: the model stays at version 0
    core = build_core(tiny_model(), "bsp", 3, ServerSettings(worker_timeout_s=None))
    sessions = await joined(core)
    numel = core.store.numel
    for rank in (0, 1):
        await core.handle("push", head(rank, sessions[rank], seq=1, base_version=0,
                                       kind="gradient", steps=1, samples=1),
                          torch.ones(numel))
    await core.stop()
    reply, _ = await core.handle("leave", head(2, sessions[2]), None)
    assert reply == {"stop": True} and core.store.version == 0
    await core.close()


async def test_a_report_that_is_not_a_map_is_ignored_and_the_status_still_answers() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    (session,) = await joined(core)
    await core.handle("heartbeat", head(0, session, stats={"steps": 4, "loss": 0.5}), None)
    await core.handle("heartbeat", head(0, session, stats=[1, 2]), None)
    worker = core.status()["workers"][0]
    assert (worker["steps"], worker["loss"]) == (4, 0.5)  # the last map's totals
    await core.stop()
    await core.close()


@pytest.mark.parametrize("op", ["pull", "query"])
async def test_only_a_push_may_be_compressed(op: str) -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    (session,) = await joined(core)
    with pytest.raises(BadRequest, match=f"only pushes may be compressed, not {op}"):
        await core.handle(op, head(0, session, seq=1, base_version=0,
                                   codec={"name": "topk"}), None)
    assert core.store.version == 0
    await core.stop()
    await core.close()


async def test_a_push_based_on_a_version_the_server_never_had_is_refused() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    (session,) = await joined(core)
    with pytest.raises(OutOfStep, match="base version 1 is ahead of the server's 0"):
        await core.handle("push", head(0, session, seq=1, base_version=1, kind="gradient",
                                       steps=1, samples=1), torch.ones(core.store.numel))
    assert core.store.version == 0
    await core.stop()
    await core.close()


async def test_a_join_away_once_the_run_has_started_is_refused() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    await joined(core)  # the run starts
    for away, error in ((True, "field 'away' is for a first join"),
                        ("yes", "field 'away' must be a bool")):
        with pytest.raises(BadRequest, match=error):
            await core.handle("join", {"run_id": RUN, "worker": 0, "away": away}, None)
    assert core.store.live == {0}
    await core.stop()
    await core.close()


async def test_the_status_shows_a_worker_held_at_a_barrier_as_waiting() -> None:
    core = build_core(tiny_model(), "bsp", 2, ServerSettings(worker_timeout_s=None))
    sessions = await joined(core)
    numel = core.store.numel
    await core.handle("push", head(0, sessions[0], seq=1, base_version=0, kind="gradient",
                                   steps=1, samples=1), torch.ones(numel))
    held = asyncio.ensure_future(core.handle("pull", head(0, sessions[0], base_version=0),
                                             None))
    for _ in range(10):
        await asyncio.sleep(0)
    assert [w["state"] for w in core.status()["workers"]] == ["waiting", "computing"]
    await core.handle("push", head(1, sessions[1], seq=1, base_version=0, kind="gradient",
                                   steps=1, samples=1), torch.ones(numel))
    reply, _ = await held
    assert reply["version"] == 1
    assert [w["state"] for w in core.status()["workers"]] == ["computing", "computing"]
    await core.stop()
    await core.close()


def test_a_silent_worker_is_dropped_within_a_second_of_its_timeout(tmp_path: Path) -> None:
    # timeout 8 s: the monitor looks every min(1, 8/4) = 1 s, so a worker silent from the
    # start (0) is found at 9, the first look with more than 8 s of silence
    async def run() -> None:
        core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=8.0),
                          events=JsonlLog(tmp_path / "events.jsonl"),
                          seam=InlineServerSeam())
        await joined(core)
        while 0 in core.store.live:
            await asyncio.sleep(0.25)
        await core.stop()
        await core.close()

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    lost = [e for e in read_jsonl(tmp_path / "events.jsonl") if e[KEY] == Kind.WORKER_LOST]
    assert [(e["worker"], e["silent_s"]) for e in lost] == [(0, 9.0)]


@pytest.mark.parametrize("secret", [5, None, ["s"], b"s"])
async def test_a_session_secret_of_another_type_is_a_403(secret: object) -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    await joined(core)
    with pytest.raises(Forbidden, match="missing or wrong session secret"):
        await core.handle("heartbeat", head(0, "") | {"session": secret}, None)
    await core.stop()
    await core.close()


async def test_a_join_sent_again_before_the_start_counts_once_for_the_barrier() -> None:
    core = build_core(tiny_model(), "asp", 2, ServerSettings(worker_timeout_s=None))
    first = asyncio.ensure_future(core.handle("join", {"run_id": RUN, "worker": 0}, None))
    for _ in range(10):
        await asyncio.sleep(0)
    session = str(core.workers[0].session)  # (the reply waits for the start)
    again = asyncio.ensure_future(core.handle("join", head(0, session), None))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not core.run.started and not again.done()  # the re-sent join counted once
    await core.handle("join", {"run_id": RUN, "worker": 1}, None)  # the second worker
    with pytest.raises(Forbidden, match="taken over by a newer join"):
        await first  # one rank, one session: the held join's secret is not the rank's
    assert (await again)[0]["meta"]["session"] == core.workers[0].session
    assert core.run.started
    await core.stop()
    await core.close()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_join_cancelled_at_the_start_barrier_no_longer_counts() -> None:
    # worker 0's connection closes while its join waits: the join is withdrawn, so worker
    # 1's join does not start the run; a restarted worker 0 joins, and it starts
    core = build_core(tiny_model(), "asp", 2, ServerSettings(worker_timeout_s=None))
    dead = asyncio.ensure_future(core.handle("join", {"run_id": RUN, "worker": 0}, None))
    await settle()
    dead.cancel()
    await settle()
    second = asyncio.ensure_future(core.handle("join", {"run_id": RUN, "worker": 1}, None))
    await settle()
    assert not core.run.started and core.store.live == {1}
    await core.handle("join", {"run_id": RUN, "worker": 0}, None)
    await asyncio.wait_for(second, 5)
    assert core.run.started and core.store.live == {0, 1}
    await core.stop()
    await core.close()


async def test_a_cancelled_join_leaves_a_later_join_of_its_rank_in_place() -> None:
    # worker 0 joins, then joins again with its secret (re-syncing); the first join's
    # connection closes: the second join holds the rank, so nothing is withdrawn
    core = build_core(tiny_model(), "asp", 2, ServerSettings(worker_timeout_s=None))
    first = asyncio.ensure_future(core.handle("join", {"run_id": RUN, "worker": 0}, None))
    await settle()
    again = asyncio.ensure_future(core.handle(
        "join", head(0, str(core.workers[0].session)), None))
    await settle()
    first.cancel()
    await settle()
    await asyncio.wait_for(core.handle("join", {"run_id": RUN, "worker": 1}, None), 5)
    reply, _ = await asyncio.wait_for(again, 5)
    assert core.run.started and core.store.live == {0, 1}
    assert reply["meta"]["session"] == core.workers[0].session != ""
    await core.stop()
    await core.close()


async def test_the_status_names_the_latest_and_the_best_accuracy() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(worker_timeout_s=None))
    core.evals.extend(EvalPoint(t, v, accuracy, 1.0)
                      for t, v, accuracy in ((1.0, 1, 0.3), (2.0, 2, 0.7), (3.0, 3, 0.5)))
    status = core.status()
    assert (status["accuracy"], status["best_accuracy"]) == (0.5, 0.7)
    await core.close()
