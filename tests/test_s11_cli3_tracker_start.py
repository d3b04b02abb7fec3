"""A tracker whose ``start`` fails (an MLflow server that cannot be reached, a W&B init
error) is named with that cause, once: the follow-up ``finish`` of the run it never opened
("log() or finish() before start()") used to replace it."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from asyncsync.study.executors import SIGTERM_STOP
from asyncsync.tracking import Point, RunInfo, TrackingError, follow
from asyncsync.tracking.base import opened

CAUSE = "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded"


class Unreachable:
    """An MLflow-like tracker whose server cannot be reached: its ``start`` fails, and its
    ``log`` and ``finish`` refuse a run it did not open, as the real trackers do."""

    def __init__(self, label: str | None = "tracking to mlflow at http://127.0.0.1:9") -> None:
        if label is not None:  # how the asyncsync trackers name themselves in errors
            self.label = label
        self.runs: dict[str, str] = {}
        self.calls: list[str] = []

    def start(self, run: RunInfo) -> None:
        self.calls.append("start")
        raise ConnectionError(CAUSE)

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        self.calls.append("log")
        opened(self.runs, run, "mlflow")

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        self.calls.append("finish")
        opened(self.runs, run, "mlflow")

    def close(self) -> None:
        self.calls.append("close")


class Recorder:
    """A tracker that works, and keeps the calls it got."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, run: RunInfo) -> None:
        self.calls.append("start")

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        self.calls.append("log")

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        self.calls.append("finish")

    def close(self) -> None:
        self.calls.append("close")


def run_folder(root: Path) -> Path:
    """A run's folder as a run writes it: its resolved recipe, one evaluation."""
    run_dir = root / "study" / "bsp-r0"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "rec", "repeat": 0, "runs": [{"name": "bsp", "workers": 2, "seed": 0}]}))
    (run_dir / "events.jsonl").write_text(json.dumps(
        {"event": "eval", "t": 1.0, "version": 3, "accuracy": 0.5}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"versions": 3, "best_accuracy": 0.5}))
    return run_dir


def followed(run_dir: Path, trackers: list[Any]) -> tuple[BaseException, list[str]]:
    """What `follow` raised while the run went on, and what became of the run."""
    fate: list[str] = []

    async def run() -> None:
        try:
            await asyncio.sleep(30)
            fate.append("ran to its end")
        except asyncio.CancelledError as exc:
            fate.append(f"cancelled: {exc}")
            raise

    with pytest.raises(Exception) as raised:
        asyncio.run(follow(run_dir, run(), trackers, every_s=0.01))
    return raised.value, fate


def test_a_tracker_that_cannot_start_is_named_with_its_cause(tmp_path: Path) -> None:
    unreachable = Unreachable()
    error, fate = followed(run_folder(tmp_path), [unreachable])
    assert isinstance(error, TrackingError), repr(error)
    assert str(error) == (f"tracking to mlflow at http://127.0.0.1:9: could not start run "
                          f"rec/study/bsp-r0: ConnectionError: {CAUSE}")
    assert str(error).count(CAUSE) == 1
    assert unreachable.calls == ["start"]  # never asked to log or finish a run it lacks
    assert fate == [f"cancelled: interrupted: {error}"]  # what its summary.json says


def test_the_trackers_that_started_still_finish_the_run(tmp_path: Path) -> None:
    """A tracker that started before the failing one closes its run; one after it is not
    asked to log or finish a run it never started."""
    before, unreachable, after = Recorder(), Unreachable(), Recorder()
    error, _ = followed(run_folder(tmp_path), [before, unreachable, after])
    assert str(error).startswith("tracking to mlflow at http://127.0.0.1:9: could not start")
    assert before.calls == ["start", "log", "finish"]  # the evaluation, then the summary
    assert unreachable.calls == ["start"] and after.calls == []


def test_a_tracker_without_a_label_goes_by_its_class(tmp_path: Path) -> None:
    error, _ = followed(run_folder(tmp_path), [Unreachable(label=None)])
    assert str(error).startswith("Unreachable: could not start run rec/study/bsp-r0: "
                                 "ConnectionError")


SMALL = """
name = "small"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 3
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 1
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def test_the_command_says_the_cause_in_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """`asyncsync run --track mlflow=http://127.0.0.1:9` with the server down."""
    from asyncsync.study import runner
    from tests.test_cli import one_error, run_main

    monkeypatch.setattr(runner, "refuse_missing", lambda *given: None)  # mlflow's absent
    monkeypatch.setattr(runner, "parse_track", lambda spec: Unreachable())
    # polled at once: the run is cut in its set-up, never after its end
    monkeypatch.setattr(runner, "follow", functools.partial(follow, every_s=0.01))
    (tmp_path / "small.toml").write_text(SMALL)
    message = one_error(run_main(capsys, "run", str(tmp_path / "small.toml"), "--plain",
                                 "--jobs", "1", "--logs", str(tmp_path / "logs"),
                                 "--track", "mlflow=http://127.0.0.1:9"))
    assert message.startswith("error: tracking to mlflow at http://127.0.0.1:9: could not "
                              "start run small/"), message
    assert message.endswith(f"/bsp: ConnectionError: {CAUSE}"), message
    (summary,) = (tmp_path / "logs" / "small").glob("*/bsp/summary.json")
    recorded = json.loads(summary.read_text())  # what --resume and the report go by
    assert recorded["interrupted"] is True  # (it said "interrupted (Ctrl-C)")
    assert recorded["error"] == f"interrupted: {message.removeprefix('error: ')}"


def test_a_real_trackers_failed_start_is_named(tmp_path: Path) -> None:
    """W&B's start, with its folder taken by a file: the cause, not "finish() before
    start()"."""
    pytest.importorskip("wandb")
    from asyncsync.tracking.wandb_tracker import WandbTracker

    (tmp_path / "taken").write_text("")
    tracker = WandbTracker("proj", tmp_path / "taken", mode="offline")
    error, fate = followed(run_folder(tmp_path), [tracker])
    assert str(error) == (f"tracking to wandb project proj (offline): could not start run "
                          f"rec/study/bsp-r0: FileExistsError: [Errno 17] File exists: "
                          f"'{tmp_path / 'taken'}'")
    assert fate == [f"cancelled: interrupted: {error}"]


def test_a_stopped_study_stops_the_followed_run_with_its_reason(tmp_path: Path) -> None:
    """SIGTERM (a Slurm time limit) cancels the supervisor with its message; the run it
    follows is cancelled with the same message (it was cancelled with none: Ctrl-C's)."""
    reason = SIGTERM_STOP
    fate: list[str] = []

    async def run() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError as exc:
            fate.append(str(exc))
            raise

    async def study() -> None:
        following = asyncio.ensure_future(follow(run_folder(tmp_path), run(), [Recorder()],
                                                 every_s=0.01))
        await asyncio.sleep(0.05)
        following.cancel(reason)
        with pytest.raises(asyncio.CancelledError):
            await following

    asyncio.run(study())
    assert fate == [reason]
