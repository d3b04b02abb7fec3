"""A study's folder as a supervisor takes it: reopened for ``--resume`` (checked against
the recipe as resolved now and against its Slurm array still queued), and held while the
study runs in it, so that two supervisors never run one study at once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asyncsync.results.studies import SUPERVISOR_LOCK, upgrade_sweep_names
from asyncsync.schema import ConfigError
from asyncsync.study.executors import queued_tasks
from asyncsync.study.recipe import Recipe

LOCK = SUPERVISOR_LOCK
"""A study folder's lock file: held (flock) by the supervisor running the study, and
naming its pid (`asyncsync.results.studies.supervisor` reads it for ``report``)."""


@contextlib.contextmanager
def claimed(root: Path, resumed: bool) -> Iterator[None]:
    """Hold the study folder `root` while the study runs in it, so that a second supervisor
    (``--resume`` of a study still running) neither clears its runs in progress nor runs
    them again beside it. The lock goes with this process, also when it is killed.

    Raises:
        ConfigError: another process holds it.
    """
    with (root / LOCK).open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise ConfigError(f"{'--resume ' if resumed else ''}{root}: another asyncsync "
                              f"run (pid {holder}) is running this study; wait for it to "
                              "end, or stop it first (its runs in progress are then marked "
                              "interrupted, and --resume runs them)") from None
        except OSError:  # a filesystem without locks (some NFS): run unguarded
            pass
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def resume_command(recipe: Recipe, root: Path) -> str:
    """The command that runs what `root` lacks: the recipe's file where known, and a
    reminder that `reopen` checks the recipe as resolved, ``--set`` options included."""
    return (f"asyncsync run {recipe.source or 'RECIPE'} --resume {root} (with the same --set "
            "options, if any)")


def reopen(recipe: Recipe, root: Path) -> Path:
    """The study folder `root` to resume, checked against `recipe` as resolved now.

    Raises:
        ConfigError: `root` is not a study folder of this recipe with these options.
    """
    if not root.is_dir():
        raise ConfigError(f"--resume {root}: no such folder")
    try:
        written = json.loads((root / "recipe.json").read_text())
    except FileNotFoundError:
        raise ConfigError(f"--resume {root}: not a study folder (no recipe.json in it)"
                          ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume {root}: not a study folder (recipe.json: {exc})") from None
    if "repeat" in written and (root.parent / "recipe.json").is_file():
        raise ConfigError(f"--resume {root}: a run's folder; --resume takes its study's "
                          f"folder: --resume {root.parent}")
    now = json.loads(json.dumps(recipe.as_table()))
    if written != now and upgrade_sweep_names(root):  # a study from before 2026-11-27
        written = json.loads((root / "recipe.json").read_text())
    if written != now:
        raise ConfigError(f"--resume {root}: its recipe.json differs from {recipe.name} as "
                          f"resolved now ({first_difference(written, now)}); give the same "
                          "recipe, --set, --only, --repeats and --clock")
    if queued := queued_tasks(root):
        array, tasks = queued
        raise ConfigError(f"--resume {root}: its Slurm job array {array} still has "
                          f"{len(tasks)} task{'s' if len(tasks) > 1 else ''} queued or running "
                          f"({', '.join(tasks[:5])}{', ...' if len(tasks) > 5 else ''}); "
                          f"resuming now would run them twice: wait for them (asyncsync "
                          f"report {root} tables what is done), or cancel them first "
                          f"(scancel {array})")
    return root


def first_difference(study: Any, now: Any, path: str = "") -> str:
    """Where a study's recipe.json and the recipe as resolved now first differ: the dotted
    key (a run named), with both values (``runs[0] (bsp).stop.time_s: 30.0 in the study,
    40.0 now``)."""
    if isinstance(study, dict) and isinstance(now, dict):
        for key in dict.fromkeys([*study, *now]):
            if study.get(key, _NOTHING) != now.get(key, _NOTHING):
                return first_difference(study.get(key, _NOTHING), now.get(key, _NOTHING),
                                        f"{path}.{key}" if path else key)
    if (isinstance(study, list) and isinstance(now, list) and len(study) == len(now)
            and _names(study) == _names(now)):
        for index, (one, other) in enumerate(zip(study, now, strict=True)):
            if one != other:
                name = f" ({one['name']})" if isinstance(one, dict) and "name" in one else ""
                return first_difference(one, other, f"{path}[{index}]{name}")
    return f"{path}: {_shown(study)} in the study, {_shown(now)} now"


_NOTHING = object()
"""A key one side of `first_difference` lacks."""


def _names(values: list[Any]) -> list[str] | None:
    """The names of a list of runs' tables (None: not runs)."""
    names = [v["name"] for v in values if isinstance(v, dict) and isinstance(v.get("name"), str)]
    return names if len(names) == len(values) else None


def _shown(value: Any) -> str:
    """A value of `first_difference` in a message: runs by their names, a table as such."""
    if value is _NOTHING:
        return "nothing"
    if isinstance(value, list) and (names := _names(value)) is not None:
        return ", ".join(names)
    return "a table" if isinstance(value, dict) else json.dumps(value)
