"""A study's run folders: which to report, whether they may share a table, in what order.

A run folder holds the run's resolved ``recipe.json`` and, once it ended, its
``summary.json``; a study's folder holds its runs and the whole recipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
from pathlib import Path
from typing import Any

from asyncsync.errors import InputError
from asyncsync.runlog.reading import label, run_name, sweep_suffix


class LogError(InputError, ValueError):
    """A directory that is not a readable run log."""


def resolved_run(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's recipe.json and its one run.

    Raises:
        LogError: recipe.json is missing or not a run's resolved recipe.
    """
    try:
        recipe = json.loads((run_dir / "recipe.json").read_text())
        spec = recipe["runs"][0]
        missing = [k for k in ("name", "protocol", "workers", "stop") if k not in spec]
        if missing:
            raise KeyError(", ".join(missing))
        workers = spec["workers"]
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise TypeError(f"workers: expected an integer >= 1, got {workers!r}")
        identity(recipe, spec)  # the fields that name the run are there, of their types
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LogError(f"{run_dir}: not a run's log directory (recipe.json: "
                       f"{type(exc).__name__}: {exc})") from None
    return recipe, spec


def identity(recipe: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Which run a run folder's `resolved_run` is, and what it was measured against (its
    budget and target): the fields every summary has, a failed run's too."""
    stop = spec["stop"]
    sweep = spec.get("sweep") or {}
    return {"recipe": recipe["name"], "run": run_name(spec["name"], sweep),
            "protocol": spec["protocol"]["name"], "workers": spec["workers"],
            "repeat": recipe.get("repeat", 0), "seed": spec.get("seed", 0), "sweep": sweep,
            "clock": spec.get("clock", "real"), "time_s": stop.get("time_s"),
            "target_accuracy": stop.get("target_accuracy")}


def find_reports(dirs: list[Path], every: bool = False) -> tuple[list[list[Path]], list[str]]:
    """The run directories to report, and notes on what was left out.

    Each DIR is a recipe, timestamp (study) or run directory, or a log root. Where a DIR
    holds several studies of one recipe, only the latest is taken (a note says so; also
    one where no run has finished yet), and all the DIRs make one report; with `every`,
    each study is a report of its own.

    Only finished runs are reported: those with a summary.json (the runner writes it last).
    A run folder without one has not finished: prepared but not started (a queued Slurm
    task), still running, or killed; one note per study names these runs (with, for a
    study submitted to Slurm, each task's state as sacct says it: `slurm_states`). A run whose
    summary.json marks it interrupted is left out with a note of its own; one that failed
    is reported (its error), also when it failed before it logged anything. A DIR that is
    one unfinished (or interrupted) run folder, or whose chosen studies have no finished
    run, is an error.

    Raises:
        LogError: a DIR that does not exist, is a file, holds no run logs, or no finished
            run.
    """
    reports: list[list[Path]] = [[]]
    notes = []
    for root in dirs:
        if root.exists() and not root.is_dir():
            raise LogError(f"{root}: is a file, not a folder: report takes a log folder "
                           "(logs/RECIPE/STAMP, a run's folder in it, or a log root such as "
                           "logs)")
        if not root.is_dir():
            raise LogError(f"{root}: no such directory")
        studies: dict[Path, list[Path]] = {}
        for found in root.rglob("recipe.json"):
            run = found.parent  # a run folder: it has logs, or its study's recipe.json
            if (run / "events.jsonl").exists() or (run.parent / "recipe.json").exists():
                studies.setdefault(run.parent, []).append(run)
        if not studies and _study_folders(root) and "repeat" not in study_recipe(root):
            # a study before its first run's folder (a run's recipe.json has its repeat)
            studies[root] = []
        if not studies:
            raise LogError(f"{root}: no run logs (directories with recipe.json and "
                           "events.jsonl) under it")
        latest = {study.parent: study for study in sorted(studies)}  # timestamps sort
        chosen = sorted(studies) if every else sorted(latest.values())
        said = []
        if len(chosen) < len(studies):
            said.append(f"{root} holds {len(studies)} studies: reporting the latest, "
                        f"{', '.join(str(c) for c in chosen)} (--all: each one separately)")
        reported = 0
        for study in chosen:
            if damage := study_recipe_damage(study):
                said.append(f"{damage}: its runs are reported from their own folders, in "
                            "name order, the first the baseline")
            runs = sorted(studies[study], key=_recipe_order)
            waiting = [r for r in runs if not _finished(r)]
            unstarted = [name for name in _study_folders(study) if not (study / name).is_dir()
                         ] if study.is_relative_to(root) else []
            written = {r: written_summary(r) for r in runs if r not in waiting}  # in run order
            cut = [r for r, summary in written.items() if summary.get("interrupted")]
            done = [r for r, summary in written.items() if not summary.get("interrupted")]
            said += [f"{r}: left out, it was {_interruption(written[r])}" for r in cut]
            if waiting or unstarted:
                said.append(_unfinished([r.name for r in waiting] + unstarted,
                                        len(runs) + len(unstarted), study))
            reported += len(done)
            if every:
                reports.append(done)
            else:
                reports[0] += [r for r in done if r not in reports[0]]
        if not reported:
            raise LogError("; ".join([f"{root}: no finished run to report", *said]))
        notes += said
    return [r for r in reports if r], notes


def _unfinished(names: list[str], total: int, study: Path) -> str:
    """The note on a study's runs without a summary.json: the supervisor still running
    them, else each one's Slurm state where `slurm_states` knows it, and how to run them."""
    said = f"{len(names)} of {total} runs {'has' if len(names) == 1 else 'have'} no " \
        "summary.json yet"
    if holder := supervisor(study):
        return f"{said}: {', '.join(names)}; the study is still running (pid {holder} holds " \
            f"{study})"
    states = slurm_states(study)
    known = [states[name][1] for name in names if name in states]
    listed = ", ".join(f"{name} (Slurm task {states[name][0]}: {states[name][1]})"
                       if name in states else name for name in names)
    if len(known) < len(names):
        said += " (not started, still running, or killed)"
    if known:
        listed += f"; task logs: {study / '.submitit'}"
    if any(state.split()[0] in ACTIVE for state in known):
        return f"{said}: {listed}; report again once these tasks have ended"
    resume = f"; asyncsync run RECIPE --resume {study} runs them" if (
        study / "recipe.json").is_file() else ""  # a study's folder; no other resumes
    return f"{said}: {listed}{resume}"


SUBMITTED = "submitted.json"
"""A study folder's record of its Slurm job array: its id, its cluster (``slurm``, or
submitit's ``local`` without Slurm) and its tasks' run folders, in the array's order
(``--resume`` asks squeue about it, ``report`` sacct)."""

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING",
          "COMPLETING", "STAGE_OUT", "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED")
"""Slurm job states of a task that has not ended."""


def slurm_states(study: Path) -> dict[str, tuple[str, str]]:
    """The task id and state of each run of the study's Slurm job array, as ``sacct`` says
    them (``4242_1``, ``OUT_OF_MEMORY``; TIMEOUT, NODE_FAIL, PENDING, ...), by run folder
    name; {} where the study was not submitted to Slurm or sacct cannot say (not on the
    PATH, accounting off, the job purged from its database)."""
    with contextlib.suppress(OSError, ValueError, LookupError, TypeError,
                             subprocess.SubprocessError):
        submitted = json.loads((study / SUBMITTED).read_text())
        array, runs = str(submitted["job_array"]), list(submitted["runs"])
        if submitted["cluster"] != "slurm":
            return {}
        listed = subprocess.run(["sacct", "-n", "-P", "-X", "-j", array, "-o", "JobID,State"],
                                capture_output=True, text=True, timeout=30, check=True)
        states = {}
        for line in listed.stdout.splitlines():  # 4242_1|OUT_OF_MEMORY, 4242_[2-5%2]|PENDING
            job, _, state = line.strip().partition("|")
            head, _, tasks = job.partition("_")
            for index in _task_indices(tasks) if head == array and tasks and state else []:
                if index < len(runs):
                    states[str(runs[index])] = (f"{head}_{index}", state)
        return states
    return {}


def _task_indices(tasks: str) -> list[int]:
    """The array task indices of sacct's ``3`` or ``[0-3,7%2]`` (throttle after ``%``)."""
    indices: list[int] = []
    for part in tasks.strip("[]").partition("%")[0].split(","):
        low, _, high = part.partition("-")
        indices += range(int(low), int(high or low) + 1)
    return indices


SUPERVISOR_LOCK = ".supervisor.lock"
"""A study folder's lock file: held (flock) by the supervisor running the study, and
naming its pid (`asyncsync.study.study_folder.claimed`)."""


def supervisor(study: Path) -> str | None:
    """The pid of the supervisor running `study` now (its lock held), else None.

    The probe takes a shared lock for an instant: a supervisor starting in that instant
    is refused as if the study were running (run it again)."""
    try:
        with (study / SUPERVISOR_LOCK).open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return handle.read().strip() or "?"
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:  # no lock file (a study before locks, or never run here), no locks
        pass
    return None


def _finished(run_dir: Path) -> bool:
    """Whether the run ended: it has a summary.json.

    Raises:
        LogError: it has none, and recipe.json is missing or not a run's resolved recipe.
    """
    if (run_dir / "summary.json").exists():
        return True
    resolved_run(run_dir)  # a folder that is no run's log says so, not that it is unfinished
    return False


def _study_folders(study: Path) -> list[str]:
    """The run folders a study's recipe.json promises, in its order (``<run>`` or, with
    repeats, ``<run>-r<k>``, as the runner names them); [] where it names none."""
    with contextlib.suppress(OSError, ValueError, LookupError, AttributeError, TypeError):
        recipe = json.loads((study / "recipe.json").read_text())
        repeats = recipe.get("repeats", 1)
        names = [run["name"] for run in recipe["runs"] if isinstance(run.get("name"), str)]
        if isinstance(repeats, int) and repeats >= 1:
            return [name if repeats == 1 else f"{name}-r{k}" for name in names
                    for k in range(repeats)]
    return []


def _interruption(summary: dict[str, Any]) -> str:
    """``interrupted`` and, where its summary says, by what (Ctrl-C, SIGTERM, its
    supervisor killed): its error, as the runner writes it."""
    error = summary.get("error")
    return error if isinstance(error, str) and error.startswith("interrupted") \
        else "interrupted"


def written_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json ({} where it has none or it is unreadable)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def pool_problem(run_dirs: list[Path], summaries: list[dict[str, Any]]) -> str | None:
    """Why these runs cannot share one table, or None: different clocks or budgets at one
    sweep point (a failed run has no times to compare), one run (and repeat) from two
    studies, or one run with different resolved settings."""
    timed = [s for s in summaries if "error" not in s]
    for key, what in (("clock", "clocks"), ("time_s", "budgets (stop.time_s)")):
        seen: dict[str, dict[Any, str]] = {}
        for s in timed:
            seen.setdefault(sweep_suffix(s.get("sweep") or {}), {}).setdefault(
                s.get(key), label(s))
        for values in seen.values():
            if len(values) > 1:
                pairs = ", ".join(f"{name} {value}" for value, name in values.items())
                return (f"cannot pool runs with different {what} ({pairs}): their times "
                        "are not comparable; report each study separately (--all)")
    where: dict[tuple[str, Any], Path] = {}
    specs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for run_dir, s in zip(run_dirs, summaries, strict=True):
        run = (label(s), s.get("repeat", 0))
        if run in where:
            return (f"{run[0]} (repeat {run[1]}) is in two studies, {where[run].parent} and "
                    f"{run_dir.parent}: report one of them, or each separately (--all)")
        where[run] = run_dir
        spec = _settings(run_dir)
        first = specs.setdefault(run[0], (run_dir, spec))
        differ = sorted(k for k in spec.keys() | first[1].keys()
                        if spec.get(k) != first[1].get(k))
        if differ:
            k = differ[0]
            return (f"{run[0]} ran with different settings in {first[0].parent} and "
                    f"{run_dir.parent} ({k}: {first[1].get(k)!r} vs {spec.get(k)!r}): "
                    "report each study separately (--all)")
    return None


def _settings(run_dir: Path) -> dict[str, Any]:
    """A run's resolved settings as dotted keys, without its seed."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        else:
            flat[prefix.rstrip(".")] = value

    walk("", json.loads((run_dir / "recipe.json").read_text())["runs"][0])
    flat.pop("seed", None)
    return flat


def _recipe_order(run_dir: Path) -> tuple[str, int, int, str]:
    """Runs of one timestamp in their recipe's order (a run's repeats together, in their
    order: its folders are ``<run>-r<k>``, so the run's own recipe.json names it), then by
    name."""
    runs = study_recipe(run_dir.parent).get("runs")
    names = [r.get("name") for r in runs if isinstance(r, dict)] if isinstance(runs, list) \
        else []
    name, repeat = run_dir.name, 0
    with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
        written = json.loads((run_dir / "recipe.json").read_text())
        name, repeat = written["runs"][0]["name"], int(written.get("repeat", 0))
    index = names.index(name) if name in names else len(names)
    return str(run_dir.parent), index, repeat, run_dir.name


def recipe_baseline(run_dir: Path) -> str | None:
    """The baseline named by the whole recipe written next to a run (its parent's)."""
    baseline = study_recipe(run_dir.parent).get("baseline")
    return baseline if isinstance(baseline, str) else None


def study_recipe(study: Path) -> dict[str, Any]:
    """The recipe.json of the study folder `study`: {} where it has none, or it is
    damaged (`study_recipe_damage` says how; it gives only the runs' order and baseline,
    each run's folder has its own)."""
    with contextlib.suppress(OSError, ValueError):
        table = json.loads((study / "recipe.json").read_text())
        if isinstance(table, dict):
            return table
    return {}


def study_recipe_damage(study: Path) -> str:
    """What is wrong with the study's recipe.json ("" when it is sound or absent)."""
    path = study / "recipe.json"
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        return f"{path}: damaged ({exc})"
    if not isinstance(table, dict) or not isinstance(table.get("runs", []), list):
        return f"{path}: damaged (not a recipe's table of runs)"
    return ""


def upgrade_sweep_names(root: Path) -> list[str]:
    """Give the swept runs of a study folder written before 2026-11-27 (folders such as
    ``bsp@compute.slowdown=[1, 3]``) the names written now (``bsp@compute.slowdown=1,3``,
    `asyncsync.runlog.reading.sweep_suffix`): their folders, the names in their
    recipe.json and summary.json, and in the study's recipe.json, last (so that one cut
    short is done again), so that ``--resume`` takes the study as it takes one of now.

    Returns:
        ``old -> new`` for each run renamed ([] for a study of now, or not a study).

    Raises:
        LogError: a run's new folder name is taken.
    """
    path = root / "recipe.json"
    try:
        table = json.loads(path.read_text())
        runs, repeats = table["runs"], int(table.get("repeats", 1))
        names = {spec["name"]: run_name(spec["name"], spec.get("sweep") or {})
                 for spec in runs}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    renamed = {old: new for old, new in names.items() if old != new}
    for old, new in renamed.items():
        for ending in [""] if repeats == 1 else [f"-r{r}" for r in range(repeats)]:
            run_dir, target = root / (old + ending), root / (new + ending)
            if not run_dir.is_dir():
                continue
            if target.exists():
                raise LogError(f"{run_dir}: cannot take its new name {target.name}: a folder "
                               "of that name exists")
            _rename_in(run_dir / "recipe.json", lambda t: t["runs"][0], "name", new)
            _rename_in(run_dir / "summary.json", lambda t: t, "run", new)
            run_dir.rename(target)
    if renamed:
        for spec in runs:
            spec["name"] = names[spec["name"]]
        _write(path, table)
    return [f"{old} -> {new}" for old, new in renamed.items()]


def _rename_in(path: Path, where: Any, key: str, name: str) -> None:
    """Set `key` of `where(table)` to `name` in the JSON file `path` (if it is there)."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        table = json.loads(path.read_text())
        where(table)[key] = name
        _write(path, table)


def _write(path: Path, table: dict[str, Any]) -> None:
    """Replace the JSON file `path` whole (a reader never sees half of it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(table, indent=2))
    partial.replace(path)
