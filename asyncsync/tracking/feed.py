"""Feeding trackers from a run folder's JSONL logs, after the fact or while the run goes on.

The logs stay the source of truth: a feed reads ``recipe.json``, ``events.jsonl`` (one
point per evaluation, the server's version as its step) and ``worker-<rank>.jsonl`` or the
one ``workers.jsonl`` of a run of many workers (each worker's compute proportion and the
bytes moved up to the evaluation's time), then the
run's ``summary.json``. A feed remembers how far it read, so calling `RunFeed.poll` again
sends only what the files gained: the supervisor streams a live run that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from asyncsync.results.report import summarize_run
from asyncsync.results.studies import LogError
from asyncsync.runlog.reading import run_name
from asyncsync.runlog.schema import KEY, RANK, WORKERS_LOG, Kind, upgrade
from asyncsync.tracking.base import Point, RunInfo, Tracker, TrackingError, flatten, naming

T = TypeVar("T")

SECRET_KEYS = ("token",)
"""Settings never sent to a tracker."""

TRACKER_CALLS = threading.Lock()
"""Held around every call to a tracker: the feeds of parallel runs poll in threads of
their own, and a tracker's tool (an SQLite store, one W&B process) takes one call at a
time."""


class _Tail:
    """The complete JSON lines a file gained since the last read (a torn line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                records.append(upgrade(json.loads(line)))
        return records


class _Worker:
    """One worker's totals up to a time: seconds computing and bytes moved."""

    def __init__(self, path: Path) -> None:
        self.tail = _Tail(path)
        self.pending: list[dict[str, Any]] = []
        self.compute_s = 0.0
        self.bytes = 0

    def advance(self, until: float) -> None:
        """Count the spans that ended by `until` (a worker writes a span when it ends)."""
        self.pending += [r for r in self.tail.read() if "t" in r]
        done = 0
        for record in self.pending:
            if record["t"] + record.get("dur", 0.0) > until:
                break
            done += 1
            if record.get(KEY) == Kind.COMPUTE:
                self.compute_s += record.get("dur", 0.0)
            self.bytes += record.get("up", 0) + record.get("down", 0)
        del self.pending[:done]


def run_info(run_dir: Path) -> RunInfo:
    """What trackers are told about the run in `run_dir`, from its recipe.json.

    A swept run of a study written before 2026-11-27 goes by its name of now
    (`asyncsync.runlog.reading.run_name`), in its id too: the study exported before and
    after a ``--resume``, which renames its folders, is one set of tracked runs.

    Raises:
        LogError: recipe.json is missing or not a run's resolved recipe.
    """
    recipe_file = run_dir / "recipe.json"
    try:
        recipe = json.loads(recipe_file.read_text())
        spec = recipe["runs"][0]
        written = spec["name"]
        name = run_name(written, dict(spec.get("sweep") or {}))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise LogError(f"{run_dir}: not a run's log directory (recipe.json: "
                       f"{type(exc).__name__}: {exc})") from None
    config = {k: v for k, v in flatten({**spec, "name": name}).items()
              if k not in SECRET_KEYS}
    folder = (name + run_dir.name[len(written):] if run_dir.name.startswith(written)
              else run_dir.name)  # the repeat's ending kept
    return RunInfo(
        run_id=f"{recipe['name']}/{run_dir.parent.name}/{folder}",
        recipe=recipe["name"], stamp=run_dir.parent.name, name=name,
        repeat=int(recipe.get("repeat", 0)), seed=int(spec.get("seed", 0)),
        clock=spec.get("clock", "real"), start_wall=recipe_file.stat().st_mtime,
        config=config, sweep=dict(spec.get("sweep") or {}))


def figures(summary: dict[str, Any]) -> dict[str, float]:
    """A summary's numeric fields (a per-worker list as ``key/w<rank>``); None left out."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if isinstance(value, list) and key.endswith("_per_worker"):
            out.update({f"{key.removesuffix('_per_worker')}/w{rank}": float(v)
                        for rank, v in enumerate(value) if _number(v)})
        elif _number(value):
            out[key] = float(value)
    return out


def _number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


class RunFeed:
    """Drives trackers from one run folder; `poll` while it runs, `finish` once it ended.

    A tracker's failed call raises a `TrackingError` naming it and the cause. One whose
    ``start`` failed, and those after it, which were not started, get no further call of
    this run: their ``log`` or ``finish`` would only fail again, on a run they lack.
    """

    def __init__(self, run_dir: Path, trackers: Sequence[Tracker]) -> None:
        self.run_dir = run_dir
        self.trackers = list(trackers)
        self.run: RunInfo | None = None
        self.step = 0
        self._events = _Tail(run_dir / "events.jsonl")
        self._workers: list[_Worker] = []
        self._shared = _Tail(run_dir / WORKERS_LOG)  # every worker's records, in a big run

    def poll(self) -> int:
        """Send the evaluations the logs gained since the last call; returns how many."""
        if self.run is None:
            if not (self.run_dir / "recipe.json").exists():
                return 0
            self.run = run_info(self.run_dir)
            workers = int(self.run.config.get("workers", 0))
            self._workers = [_Worker(self.run_dir / f"worker-{rank}.jsonl")
                             for rank in range(workers)]
            with TRACKER_CALLS:
                self._start(self.run)
        sent = 0
        for record in self._events.read():
            if record.get(KEY) == Kind.EVAL and _number(record.get("t")) and _number(
                    record.get("accuracy")):  # a misshapen one: the report names the log
                point = self._point(record)
                with TRACKER_CALLS:
                    for tracker in self.trackers:
                        with naming(tracker, "log", self.run):
                            tracker.log(self.run, point, self.run.start_wall + point.time_s)
                sent += 1
        return sent

    def _start(self, run: RunInfo) -> None:
        for at, tracker in enumerate(self.trackers):
            try:
                with naming(tracker, "start", run):
                    tracker.start(run)
            except TrackingError:
                self.trackers = self.trackers[:at]  # those that opened the run
                raise

    def _point(self, record: dict[str, Any]) -> Point:
        time_s = float(record["t"])
        self.step = int(record.get("version", self.step))
        metrics = {"accuracy": float(record["accuracy"])}
        if _number(record.get("loss")):
            metrics["loss"] = float(record["loss"])
        moved = 0
        for shared in self._shared.read():
            rank = shared.pop(RANK, None)
            if isinstance(rank, int) and 0 <= rank < len(self._workers) and "t" in shared:
                self._workers[rank].pending.append(shared)
        for rank, worker in enumerate(self._workers):
            worker.advance(time_s)
            moved += worker.bytes
            if time_s > 0:
                metrics[f"compute_proportion/w{rank}"] = round(worker.compute_s / time_s, 4)
        metrics["mb_moved"] = moved / 1e6
        metrics["time_s"] = time_s
        return Point(self.step, time_s, metrics)

    def finish(self) -> RunInfo:
        """Send the rest, then the run's summary (summary.json, else computed from the logs).

        Raises:
            LogError: the folder is not a run's logs.
        """
        self.poll()
        if self.run is None:
            raise LogError(f"{self.run_dir}: not a run's log directory (no recipe.json)")
        try:
            summary = json.loads((self.run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            summary = summarize_run(self.run_dir)
        last = summary.get("versions")
        step = int(last) if _number(last) else self.step
        with TRACKER_CALLS:
            for tracker in self.trackers:
                with naming(tracker, "finish", self.run):
                    tracker.finish(self.run, figures(summary), step)
        return self.run


def run_dirs_of(root: Path) -> list[Path]:
    """The run folders under `root` (itself included), in the order they were run."""
    found = [events.parent for events in root.rglob("events.jsonl")
             if (events.parent / "recipe.json").exists()]
    return sorted(found, key=lambda d: ((d / "recipe.json").stat().st_mtime, str(d)))


def export_runs(run_dirs: Sequence[Path], trackers: Sequence[Tracker]) -> list[RunInfo]:
    """Send finished runs to the trackers (the same run again updates its tracked run)."""
    return [RunFeed(run_dir, trackers).finish() for run_dir in run_dirs]


def export_study(study_dir: Path, trackers: Sequence[Tracker]) -> list[RunInfo]:
    """Send every run of a study folder (or any folder of runs) to the trackers, then close
    them.

    Raises:
        LogError: no run logs under `study_dir`.
    """
    run_dirs = run_dirs_of(study_dir)
    if not run_dirs:
        raise LogError(f"{study_dir}: no run logs (directories with recipe.json and "
                       "events.jsonl) under it")
    try:
        return export_runs(run_dirs, trackers)
    finally:
        for tracker in trackers:
            tracker.close()


async def follow(run_dir: Path, job: Awaitable[T], trackers: Sequence[Tracker],
                 every_s: float = 2.0) -> T:
    """Await the run `job` writing `run_dir` while streaming its logs to the trackers.

    For the supervisor: the files are read in a thread, every `every_s` seconds, never in a
    node's event loop. The run's summary is sent once `job` is done, also when it failed.
    A tracker's failure cancels `job` (which records ``interrupted: <the failure>``, so
    ``--resume`` runs it again); a cancellation of this call passes on to `job` with its
    message (Ctrl-C's or SIGTERM's). What raised first is raised, never what the trackers'
    ``finish`` of the cut run raises after it.
    """
    feed = RunFeed(run_dir, trackers)
    task = asyncio.ensure_future(job)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=every_s)
            await asyncio.to_thread(feed.poll)
        result = task.result()
    except BaseException as exc:
        task.cancel(_interruption(exc))
        await asyncio.wait({task})  # it records why it stopped (a later cancel says Ctrl-C)
        if not task.cancelled():
            task.exception()  # retrieved: how it ended, which is not the error to show
        with contextlib.suppress(Exception):  # the first error is the one to see
            await asyncio.to_thread(feed.finish)
        raise
    with contextlib.suppress(LogError):
        await asyncio.to_thread(feed.finish)
    return result


def _interruption(exc: BaseException) -> str | None:
    """The message `follow` cancels its run with when `exc` stops it: a cancellation's own
    (None for Ctrl-C's), else ``interrupted: <exc>``."""
    if isinstance(exc, asyncio.CancelledError):
        return exc.args[0] if exc.args and isinstance(exc.args[0], str) else None
    return f"interrupted: {exc}"
