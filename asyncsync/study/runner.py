"""Runs a recipe's study: every run x repeat x sweep value, each writing a folder of its own.

Virtual-clock runs are independent and deterministic: with ``jobs`` > 1 they run that many
at a time, each in a child process (`asyncsync.study.executors`), or as one Slurm job array; the
table is built from the folders in the recipe's order. Real-clock runs go one at a time.
A study can be resumed: only the runs without a finished summary.json run again.

A real-clock run is a server process and N worker processes on this machine
(`asyncsync.study.nodes`). Every run writes ``logs/<recipe>/<timestamp>/<run>/``: ``recipe.json``
(the resolved run), ``events.jsonl`` (server: start, evaluations, stop),
``worker-<rank>.jsonl`` (spans and totals), the nodes' console output (``*.log``) and
``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import signal
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.markup import escape

from asyncsync.clock import now
from asyncsync.results.report import preload_plots, publish
from asyncsync.results.studies import SUBMITTED, LogError, written_summary
from asyncsync.schema import ConfigError
from asyncsync.study.assembly import dataset_loader
from asyncsync.study.children import Child, Spares
from asyncsync.study.dashboard import Dashboard
from asyncsync.study.executors import (
    SIGTERM_STOP,
    SlurmOptions,
    cause,
    interrupted,
    shared_problem,
    slurm_executor,
    submit_array,
    write_summary,
)
from asyncsync.study.netns import preflight
from asyncsync.study.recipe import Recipe, load_recipe
from asyncsync.study.run_one import (
    calibration,
    check_data,
    check_devices,
    check_models,
    prepare_folder,
    run_and_record,
)
from asyncsync.study.specs import RunSpec
from asyncsync.study.study_folder import claimed, reopen, resume_command
from asyncsync.tracking import (
    RunFeed,
    Tracker,
    TrackingError,
    follow,
    parse_track,
    refuse_missing,
    unique_specs,
)

T = TypeVar("T")


@dataclass(frozen=True)
class _Slot:
    """One run of the study: its recipe entry (`index`), repeat, resolved spec and folder."""

    index: int
    repeat: int
    spec: RunSpec
    run_dir: Path


@dataclass
class _Study:
    """A study in progress: its slots in the recipe's order and the summaries so far."""

    recipe: Recipe
    root: Path
    slots: list[_Slot]
    dashboard: Dashboard
    trackers: Sequence[Tracker]
    done: dict[int, dict[str, Any]]
    untracked: TrackingError | None = None
    """A Slurm array's tracker failure: the tasks ran on, the supervisor watched on."""

    def base(self, slot: _Slot) -> RunSpec:
        return self.recipe.runs[slot.index]

    def record(self, position: int, summary: dict[str, Any]) -> None:
        slot = self.slots[position]
        self.done[position] = summary
        self.dashboard.finished(self.base(slot), slot.index, summary, slot.run_dir.name)


async def run_recipe(recipe: Recipe, logs: Path = Path("logs"), live: bool | None = None,
                     trackers: Sequence[Tracker] = (), *, jobs: int = 1,
                     resume: Path | None = None, slurm: SlurmOptions | None = None,
                     wait: bool = True, spares: Spares | None = None,
                     ) -> list[dict[str, Any]]:
    """Run every run of `recipe`; returns their summaries and prints the table.

    Virtual-clock runs go `jobs` at a time, each in a process of its own, or with `slurm`
    as one Slurm job array (without `wait`, this returns at once, with no summaries);
    real-clock runs go one after another (they measure the host). With `resume` (a study
    folder of this recipe), only the runs without a summary.json of a finished run are run
    again, from their start. Each run's logs stream to the `trackers` while it runs. The
    child processes come from `spares` while it has any (started early, see
    `asyncsync.study.children`); those left are closed before the real-clock runs, and by
    the caller if this raises before.

    On Ctrl-C or SIGTERM (the task is cancelled, see `_terminable`) it prints which stopped
    it, the table of the runs that finished and the log path, marks the runs in progress
    interrupted by it, then lets the cancellation go on; so too on a tracker's failure
    (`TrackingError`, raised after), where some run had finished (else only it is said).
    """
    datasets = dataset_loader()  # each loaded once for both checks
    check_models(recipe, datasets)
    await asyncio.to_thread(check_data, recipe, datasets)  # before any folder, not in N processes
    if slurm is None:  # a Slurm task's node has its own devices
        await asyncio.to_thread(check_devices, recipe)  # a driver query, off the loop
    await asyncio.to_thread(preflight, recipe.runs)  # kernel shaping: root, ip, tc, netem
    root = reopen(recipe, resume) if resume else _new_study(logs / recipe.name)
    with claimed(root, resume is not None):
        return await _run_study(recipe, root, live, trackers, jobs, resume is not None,
                                slurm, wait, spares)


async def _run_study(recipe: Recipe, root: Path, live: bool | None,
                     trackers: Sequence[Tracker], jobs: int, resume: bool,
                     slurm: SlurmOptions | None, wait: bool, spares: Spares | None,
                     ) -> list[dict[str, Any]]:
    """`run_recipe` in the study folder `root`, which this process holds."""
    (root / "recipe.json").write_text(json.dumps(recipe.as_table(), indent=2))
    slots = [_Slot(index, repeat, run,
                   root / (spec.name if recipe.repeats == 1 else f"{spec.name}-r{repeat}"))
             for index, spec in enumerate(recipe.runs)
             for repeat, run in enumerate(recipe.repeated(spec))]
    study = _Study(recipe, root, slots, Dashboard(recipe, live), trackers,
                   {i: s for i, s in enumerate(map(_kept, slots)) if s is not None})
    todo = [i for i in range(len(slots)) if i not in study.done]
    if resume:  # a failed run is done (its error is deterministic): say which are kept
        failed = [slots[i].run_dir.name for i in sorted(study.done) if "error" in study.done[i]]
        kept = (f"; kept as failed: {', '.join(failed)} (delete a run's folder to run it "
                "again)") if failed else ""
        study.dashboard.console.print(f"resuming {root}: {len(study.done)} of {len(slots)} "
                                      f"runs done, {len(todo)} to run{kept}", highlight=False,
                                      soft_wrap=True)
    virtual = [i for i in todo if slots[i].spec.clock == "virtual"]
    if slurm is not None and len(virtual) < len(todo):
        raise ConfigError("--executor slurm runs virtual-clock runs only (real-clock runs "
                          "measure the host they run on): use --clock virtual")
    try:
        with study.dashboard:
            study.dashboard.study(len(slots), len(study.done))
            if slurm is not None:
                if not await _submit(study, todo, slurm, wait):
                    return []
            else:
                if jobs > 1:
                    await _pool(study, virtual, jobs, spares)
                if spares is not None:  # no child left idle beside runs that time the host
                    await asyncio.to_thread(spares.close)
                await _in_turn(study, [i for i in todo if i not in study.done])
    except asyncio.CancelledError as exc:
        _stopped(study, cause(exc))
        raise
    except TrackingError:  # a run's tracker failed: the study stopped, its runs recorded
        if study.done:  # else nothing to table or resume: the error line says it all
            _stopped(study, "a tracker failed")
        raise
    finally:
        for tracker in trackers:
            tracker.close()
    _publish(study)
    if study.untracked is not None:  # said when it happened; the exit status says it too
        raise study.untracked
    return [study.done[i] for i in sorted(study.done)]


def _new_study(base: Path) -> Path:
    """A new study folder under `base`, named by the time to the second (then -2, -3, ...
    for studies started within the same second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for number in itertools.count(1):
        root = base / (stamp if number == 1 else f"{stamp}-{number}")
        with contextlib.suppress(FileExistsError):
            root.mkdir(parents=True)
            return root
    raise AssertionError("unreachable")


def _kept(slot: _Slot) -> dict[str, Any] | None:
    """The summary of the slot's run if it finished (ran or failed), else None, its
    partial folder (interrupted, killed, still unsummarized) cleared to run it again."""
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((slot.run_dir / "summary.json").read_text())
        if isinstance(summary, dict) and not summary.get("interrupted"):
            return summary
    if slot.run_dir.exists():
        shutil.rmtree(slot.run_dir)
    return None


async def _in_turn(study: _Study, todo: list[int]) -> None:
    """Run the slots `todo` one after another in this process."""
    for position in todo:
        slot = study.slots[position]
        job = run_and_record(slot.spec, study.recipe, slot.run_dir, study.dashboard,
                             slot.index, slot.repeat)
        study.record(position, await (follow(slot.run_dir, job, study.trackers)
                                      if study.trackers else job))


async def _pool(study: _Study, todo: list[int], jobs: int, spares: Spares | None) -> None:
    """Run the (virtual) slots `todo` in up to `jobs` child processes (from `spares` first),
    each taking the next run in the recipe's order when its last one is done."""
    queue = list(reversed(todo))

    async def one(position: int, child: Child) -> dict[str, Any]:
        slot = study.slots[position]
        calibrated = await calibration(slot.spec, study.dashboard)
        prepare_folder(slot.spec, study.recipe, slot.run_dir, slot.repeat)

        def show(status: dict[str, Any]) -> None:
            study.dashboard.update_run(slot.run_dir.name, study.base(slot), status)

        job = child.run(slot.run_dir, calibrated, show)
        try:
            await (follow(slot.run_dir, job, study.trackers) if study.trackers else job)
            summary: dict[str, Any] = json.loads((slot.run_dir / "summary.json").read_text())
        except RuntimeError as exc:  # its process died (out of memory?): --resume runs it
            summary = interrupted(slot.run_dir, cause(exc))
            write_summary(slot.run_dir, summary)
        except BaseException as exc:  # Ctrl-C, SIGTERM, a tracker's failure: --resume
            if not (slot.run_dir / "summary.json").exists():  # else it ended first: kept
                write_summary(slot.run_dir, interrupted(slot.run_dir, cause(exc)))
            raise
        return summary

    async def worker() -> None:
        child: Child | None = None
        try:
            while queue:
                position = queue.pop()
                if child is None or not child.alive:
                    child = await Child.start(spares)
                study.record(position, await one(position, child))
        finally:
            if child is not None:
                await child.close()

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(jobs, len(todo)))]
    plots = asyncio.ensure_future(asyncio.to_thread(preload_plots))  # while the runs go
    stopped: str | None = None  # why the runs still going stop: Ctrl-C's None, or an error
    try:
        await asyncio.gather(*tasks)
    except Exception as exc:  # a run's error stopped the study (its tracker failed):
        # the runs beside it are cut by that, not by a Ctrl-C
        stopped = cause(exc)
        raise
    finally:
        for task in tasks:
            task.cancel(stopped)
        await asyncio.gather(*tasks, plots, return_exceptions=True)


SLURM_POLL_S = 5.0
"""How often the supervisor looks for finished run folders of a Slurm array."""

SLURM_GRACE_S = 60.0
"""How long a task's summary.json may take to show on this node once the task ended (a
shared filesystem's caches)."""


async def _submit(study: _Study, todo: list[int], options: SlurmOptions, wait: bool) -> bool:
    """Submit the slots `todo` as one Slurm job array; with `wait`, collect their folders
    as they finish and return True; else return False at once."""
    console = study.dashboard.console
    if not todo:
        return True
    calibrated = []
    for position in todo:
        slot = study.slots[position]
        prepare_folder(slot.spec, study.recipe, slot.run_dir, slot.repeat)
        step_s = await calibration(slot.spec, study.dashboard)
        calibrated.append(repr(step_s) if step_s else "")
    executor = slurm_executor(study.root / ".submitit", options, study.recipe.name)
    if executor.cluster != "slurm":
        console.print(f"[yellow]warning:[/yellow] no Slurm on this machine (srun is not on "
                      f"the PATH): submitit runs the {len(todo)} tasks here, as local "
                      "processes", highlight=False, soft_wrap=True)
    elif problem := shared_problem(study.root):
        console.print(f"[yellow]warning:[/yellow] {problem}; the log root must be on a "
                      "filesystem the compute nodes share (--logs)", highlight=False,
                      soft_wrap=True)
    dirs = [str(study.slots[position].run_dir) for position in todo]
    array = await asyncio.to_thread(submit_array, executor, dirs, calibrated, study.root)
    array_id = str(array[0].job_id).split("_")[0]
    (study.root / SUBMITTED).write_text(json.dumps(
        {"job_array": array_id, "cluster": executor.cluster,
         "runs": [Path(d).name for d in dirs]}, indent=2))
    console.print(f"submitted {len(array)} runs as job array {array_id} "
                  f"({executor.cluster}); task logs: {study.root / '.submitit'}",
                  highlight=False, soft_wrap=True)
    if not wait:
        console.print(f"collect the results once it is done: asyncsync report {study.root} "
                      f"(or {resume_command(study.recipe, study.root)}, to run what is "
                      "missing)", highlight=False, soft_wrap=True)
        return False
    pending = dict(zip(todo, array, strict=True))
    feeds = {position: RunFeed(study.slots[position].run_dir, study.trackers)
             for position in todo} if study.trackers else {}
    ended: dict[int, float] = {}
    try:
        while pending:
            for position, job in list(pending.items()):
                run_dir = study.slots[position].run_dir
                await _feed(study, feeds, position)
                summary = written_summary(run_dir) or None  # once it is there
                if summary is None and await asyncio.to_thread(job.done):
                    ended.setdefault(position, now())
                    if now() - ended[position] < SLURM_GRACE_S:
                        continue
                    state = await asyncio.to_thread(getattr, job, "state")  # sacct asked
                    summary = interrupted(run_dir, f"interrupted: its Slurm task ended "
                                          f"({state}) without a summary.json; see "
                                          f"{job.paths.stderr}")
                    if state != "COMPLETED":  # else it may yet show (a cache): kept
                        write_summary(run_dir, summary)  # report says why; --resume runs it
                if summary is not None:
                    del pending[position]
                    await _feed(study, feeds, position, finish=True)
                    study.record(position, summary)
            if pending:
                await asyncio.sleep(SLURM_POLL_S)
    except asyncio.CancelledError as exc:
        for position, job in pending.items():
            with contextlib.suppress(Exception):
                job.cancel(check=False)
            run_dir = study.slots[position].run_dir
            write_summary(run_dir, interrupted(run_dir, cause(exc)))
        raise
    return True


async def _feed(study: _Study, feeds: dict[int, RunFeed], position: int,
                finish: bool = False) -> None:
    """`RunFeed.poll` (or `RunFeed.finish`, the feed then dropped) of the run at
    `position`, if it is tracked. A tracker's failure stops the study's tracking, not the
    supervisor: the array's tasks run on without it, and it collects them
    (`_Study.untracked`)."""
    if position not in feeds:
        return
    try:
        with contextlib.suppress(LogError):  # a damaged run folder: the report names it
            feed = feeds[position]
            await asyncio.to_thread(feed.finish if finish else feed.poll)
    except TrackingError as exc:
        study.untracked = TrackingError(
            f"{exc}; the job array's runs go on, untracked from here: once they are done, "
            f"asyncsync report {study.root} --track SPEC sends them")
        feeds.clear()
        study.dashboard.console.print(f"[yellow]warning:[/yellow] {escape(str(study.untracked))}",
                                      highlight=False, soft_wrap=True)
    if finish:
        feeds.pop(position, None)


def _stopped(study: _Study, why: str) -> None:
    """Say what stopped the study, that its runs in progress are marked interrupted and
    how to go on; then table and plot the runs that finished."""
    study.dashboard.console.print(
        f"[yellow]{escape(why)}[/yellow]: the runs in progress are marked interrupted in "
        f"their summary.json; continue with {escape(resume_command(study.recipe, study.root))}",
        highlight=False, soft_wrap=True)
    _publish(study)


def _publish(study: _Study) -> None:
    """The table, CSV and plots of the finished runs in the recipe's order, then where the
    logs are."""
    order = sorted(study.done)
    if order:
        publish([study.slots[i].run_dir for i in order], [study.done[i] for i in order],
                study.recipe.baseline, study.root, study.dashboard.console,
                title=study.recipe.name)
    study.dashboard.console.print(f"logs: {study.root}", highlight=False, soft_wrap=True)


def run_recipe_file(path: str | Path, overrides: list[str], only: list[str],
                    logs: Path = Path("logs"), live: bool | None = None,
                    repeats: int | None = None, trackers: Sequence[Tracker] = (), *,
                    jobs: int = 1, resume: Path | None = None,
                    slurm: SlurmOptions | None = None, wait: bool = True,
                    spares: Spares | None = None, track: Sequence[str] = ()
                    ) -> list[dict[str, Any]]:
    """Load and run a recipe file (the CLI's ``run``); see `run_recipe`. The trackers of
    the ``--track`` specs `track` and of the recipe's own ``[tracking]`` join `trackers`,
    each place once."""
    recipe = load_recipe(path, overrides, only, repeats)
    refuse_missing(track, recipe.tracking, str(path))
    trackers = [*trackers, *(parse_track(spec) for spec in
                             unique_specs([*track, *recipe.track_specs]))]
    return asyncio.run(_terminable(run_recipe(recipe, logs, live, trackers, jobs=jobs,
                                              resume=resume, slurm=slurm, wait=wait,
                                              spares=spares)))


async def _terminable(job: Coroutine[Any, Any, T]) -> T:
    """Await `job`, which SIGTERM (a Slurm time limit, `kill`) cancels as Ctrl-C does, with
    `SIGTERM_STOP` as the cancellation's message: the runs in progress are marked
    interrupted by it, so ``--resume`` runs them again, the table of the finished ones is
    printed, and KeyboardInterrupt follows. (Killed outright, the
    supervisor prints nothing; its children mark their runs interrupted themselves, see
    `asyncsync.study.executors.SupervisorGone`.)"""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        task.cancel(SIGTERM_STOP)

    try:
        loop.add_signal_handler(signal.SIGTERM, terminate)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread; Windows
        return await job
    try:
        return await job
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
