"""Where a study's independent virtual runs execute: local child processes (``--jobs``) or
one Slurm job array through submitit (``--executor slurm``).

The run folder is the interface. The supervisor prepares a run's folder (its recipe.json);
`run_folder` simulates that run there and writes its summary.json, whoever calls it: a
child of `asyncsync.study.children` (``asyncsync simulate --serve``), or a Slurm array task.
Only paths and plain strings go in, nothing but the folder comes back (no pickled results).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncsync.clock import wall
from asyncsync.results.report import summarize_run
from asyncsync.results.studies import SUBMITTED
from asyncsync.schema import ConfigError
from asyncsync.study.dashboard import condensed
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import StatusSink, simulate
from asyncsync.training.trainer import resolve_device

STATUS_EVERY_S = 0.5
"""How often (real seconds) a child reports its run's status to the supervisor."""


class SupervisorGone(Exception):
    """The supervisor reading a child's status lines is gone (its pipe broke): killed
    outright, so it could not mark the child's run interrupted itself."""


LOCAL_FILESYSTEMS = ("tmpfs", "ramfs", "overlay")
"""Filesystem types that compute nodes do not share with a login node."""


def error_line(exc: BaseException) -> str:
    """The first line of an exception's message, after its type unless a RuntimeError."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if isinstance(exc, RuntimeError) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def failure(run_dir: Path, error: str) -> dict[str, Any]:
    """The summary of a run that failed, from its recipe.json (``--resume`` keeps it)."""
    written = json.loads((run_dir / "recipe.json").read_text())
    spec = written["runs"][0]
    summary = {"recipe": written["name"], "run": spec["name"],
               "protocol": spec["protocol"]["name"], "repeat": written.get("repeat", 0),
               "seed": spec.get("seed", 0), "sweep": spec.get("sweep") or {},
               "clock": spec.get("clock", "real"), "error": error}
    return summary


CTRL_C = "interrupted (Ctrl-C)"
SIGTERM_STOP = "interrupted (SIGTERM: a kill, or a Slurm time limit or preemption)"
SUPERVISOR_KILLED = "interrupted (its supervisor was killed)"
"""What cut a run short, as its summary's error and the report's note say it."""


def cause(stopped: BaseException) -> str:
    """What cut a run short, from what stopped it: a cancellation's message (SIGTERM's
    handler's `SIGTERM_STOP`, or the error that stopped the study), else Ctrl-C's
    (asyncio.run cancels without one); an error (a tracker's failure) as
    ``interrupted: <the error>``."""
    if not isinstance(stopped, asyncio.CancelledError):
        return f"interrupted: {stopped}"
    message = stopped.args[0] if stopped.args else None
    return message if isinstance(message, str) and message.startswith("interrupted") \
        else CTRL_C


def interrupted(run_dir: Path, why: str) -> dict[str, Any]:
    """The summary of a run cut short (`why`: `CTRL_C`, `SIGTERM_STOP`,
    `SUPERVISOR_KILLED`), from its recipe.json (``--resume`` runs it again)."""
    return {**failure(run_dir, why), "interrupted": True}


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, replaced at once (a reader on another node never sees half of it).

    Raises:
        OSError: it could not be written (a full disk), naming summary.json; no partial
            file is left, and the run counts as unfinished.
    """
    written, partial = run_dir / "summary.json", run_dir / "summary.json.tmp"
    try:
        partial.write_text(json.dumps(summary, indent=2))
        partial.replace(written)
    except OSError as exc:  # a failed write() names no file
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(written)) from exc


def run_folder(run_dir: str, calibrated_s: float | None = None,
               status: StatusSink | None = None) -> bool:
    """Simulate the prepared run in `run_dir` and write its summary.json.

    A run that raises gets a summary with its error's first line. Returns whether it ran.
    What an earlier attempt left in the folder (a Slurm task requeued after preemption) is
    removed first: logs are appended to, and two attempts' records would count twice.
    """
    folder = Path(run_dir)
    written = json.loads((folder / "recipe.json").read_text())
    for path in folder.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name != "recipe.json":
            path.unlink()
    known: dict[str, Any] = {}
    try:
        spec = load_recipe(folder / "recipe.json").runs[0]
        _check_device(spec.device)
        facts = simulate(spec, folder, f"{written['name']}/{spec.name}", status, calibrated_s,
                         known)
        summary = {**summarize_run(folder), **facts}
    except SupervisorGone:  # not the run's fault: --resume runs it again
        summary = interrupted(folder, SUPERVISOR_KILLED)
    except Exception as exc:
        summary = {**failure(folder, error_line(exc)), **known}
    write_summary(folder, summary)
    return "error" not in summary


def _check_device(device: str) -> None:
    """Refuse a run whose ``device`` this node lacks, naming the key (the supervisor
    checked its own host; a Slurm task's node may have other devices).

    Raises:
        RuntimeError: the device is not here (its first line is the run's error).
    """
    try:
        resolve_device(device)
    except ValueError as exc:
        raise RuntimeError(f"device: {exc} on node {socket.gethostname()}; ask Slurm for "
                           'GPUs (--slurm-gpus N), or use device = "cpu"') from None


def slurm_task(run_dir: str, calibrated_s: str) -> None:
    """One Slurm array task: `run_folder` in this process (the folder holds the result)."""
    run_folder(run_dir, float(calibrated_s) if calibrated_s else None)


def status_printer() -> StatusSink:
    """A status sink that writes a JSON line to stdout at most every `STATUS_EVERY_S`."""
    last = [0.0]

    def emit(status: dict[str, Any]) -> None:
        now = wall()
        if now - last[0] >= STATUS_EVERY_S:
            last[0] = now
            _tell_supervisor(condensed(status))

    return emit


def _tell_supervisor(message: dict[str, Any]) -> None:
    """One JSON line to the supervisor on stdout.

    Raises:
        SupervisorGone: its end of the pipe is closed.
    """
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except BrokenPipeError as exc:
        # what is left in stdout's buffer goes nowhere, not into an error at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise SupervisorGone from exc


def serve(lines: Iterable[str]) -> None:
    """Run folders one after another, as `asyncsync.study.children.Child` sends them: each
    line holds a run folder and its calibrated step time (or nothing), tab-separated.
    Prints the runs' status lines, then ``{"done": FOLDER}`` after each."""
    status = status_printer()
    for line in lines:
        run_dir, _, calibrated = line.rstrip("\n").partition("\t")
        run_folder(run_dir, float(calibrated) if calibrated else None, status)
        try:
            _tell_supervisor({"done": run_dir})
        except SupervisorGone:  # nobody left to send runs: stop
            return


@dataclass(frozen=True)
class SlurmOptions:
    """What each array task asks Slurm for (None: the cluster's default)."""

    partition: str | None = None
    time_min: int = 60
    cpus: int = 1
    gpus: int = 0
    array_parallelism: int | None = None


def slurm_executor(folder: Path, options: SlurmOptions, name: str) -> Any:
    """A submitit executor for `options`, its files under `folder`.

    Without ``sbatch`` on this machine submitit picks its local executor, which runs the
    tasks here as processes.

    Raises:
        ConfigError: submitit is not installed.
    """
    try:
        import submitit
    except ImportError:
        raise ConfigError("--executor slurm needs submitit: pip install "
                          "asyncsync[slurm]") from None
    executor = submitit.AutoExecutor(folder=folder)
    slurm: dict[str, Any] = {"slurm_partition": options.partition} if options.partition else {}
    if options.array_parallelism:
        slurm["slurm_array_parallelism"] = options.array_parallelism
    if options.gpus:  # no GPU request at all otherwise: clusters without GPUs may refuse one
        slurm["gpus_per_node"] = options.gpus
    executor.update_parameters(name=name, timeout_min=options.time_min,
                               cpus_per_task=options.cpus, **slurm)
    return executor


def submit_array(executor: Any, dirs: list[str], calibrated: list[str], study: Path) -> Any:
    """Submit one array task per run folder of `dirs` (`slurm_task`); returns the jobs.

    Raises:
        ConfigError: Slurm refused the array (sbatch's own reason in the message).
    """
    said = io.StringIO()  # submitit prints a refusal's stderr, then raises it
    try:
        with contextlib.redirect_stderr(said):
            return executor.map_array(slurm_task, dirs, calibrated)
    except (RuntimeError, OSError) as exc:  # submitit's FailedJobError: sbatch's stderr
        reason = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ConfigError(f"--executor slurm: sbatch refused the job array ({reason}); once "
                          f"that is fixed, asyncsync run RECIPE --executor slurm --resume "
                          f"{study} submits its runs") from None


def queued_tasks(study: Path) -> tuple[str, list[str]] | None:
    """The study's Slurm job array and its tasks still queued or running (``squeue``), or
    None: not submitted to Slurm, no squeue here, or none left (squeue forgets ended jobs)."""
    with contextlib.suppress(OSError, ValueError, LookupError, TypeError,
                             subprocess.SubprocessError):
        submitted = json.loads((study / SUBMITTED).read_text())
        if submitted["cluster"] != "slurm":
            return None
        array = str(submitted["job_array"])
        listed = subprocess.run(["squeue", "-h", "-j", array, "-o", "%i"], capture_output=True,
                                text=True, timeout=60)
        tasks = listed.stdout.split()
        return (array, tasks) if listed.returncode == 0 and tasks else None
    return None


def shared_problem(path: Path) -> str | None:
    """Why compute nodes probably cannot see `path` (None: no reason known)."""
    resolved = path.resolve()
    if resolved.is_relative_to("/tmp") or resolved.is_relative_to("/dev/shm"):
        return f"{resolved} is under /tmp or /dev/shm, which each node has its own of"
    with contextlib.suppress(OSError):
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text()
                  .splitlines() if len(line.split()) > 2]
        point, kind = max(((p, k) for p, k in mounts if resolved.is_relative_to(p)),
                          key=lambda m: len(m[0]), default=("", ""))
        if kind in LOCAL_FILESYSTEMS:
            return f"{resolved} is on a {kind} filesystem ({point}), local to this machine"
    return None
