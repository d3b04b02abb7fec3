"""Command line: ``asyncsync run | check | protocols | report | server | worker | launch |
worker-token``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from asyncsync.errors import InputError
from asyncsync.results.comparison import baseline_choices, is_baseline
from asyncsync.results.layout import make_console
from asyncsync.results.report import output_folder, publish, report_summary
from asyncsync.results.studies import LogError, find_reports, pool_problem, recipe_baseline
from asyncsync.runlog.reading import unswept_name
from asyncsync.schema import ConfigError
from asyncsync.study.command_line import UsageError, slurm_given
from asyncsync.study.command_line import build_parser as _parser
from asyncsync.study.launch import TOKEN_ENV
from asyncsync.tracking import export_runs, parse_track, refuse_missing, unique_specs

if TYPE_CHECKING:
    from asyncsync.study.recipe import Recipe

# The commands import torch (and what needs it) when they run, not here: `run` starts its
# child processes first, so that their imports of torch overlap its own
# (asyncsync.study.children), and `report` or --help never load it.


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` with ``--clock`` (a ``clock`` override)."""
    return [*args.overrides, *([f'clock="{args.clock}"'] if args.clock else [])]


def _what_runs(recipe: Recipe) -> str:
    """``check``'s count of the runs `run` would start, and what they are compared with."""
    count = len(recipe.runs)
    runs = f"{count} run{'s' if count > 1 else ''}"
    if recipe.repeats > 1:
        runs += f" x {recipe.repeats} repeats = {count * recipe.repeats}"
    if any(spec.base_name == recipe.baseline for spec in recipe.runs):
        return f"{runs}, baseline {recipe.baseline}"
    return f"{runs}, no baseline: {recipe.baseline} is not among the runs, so no speedups"


def _report(args: argparse.Namespace, console: Console) -> int:
    """Rebuild tables, CSVs and plots from logs: one report, or one per study (--all).
    Every report is checked (its runs poolable, its baseline a run, its output folder
    writable) before anything is printed, and first of all the trackers' packages, each
    named as its ``--track`` (as ``run`` names them)."""
    refuse_missing(args.track, {}, "")
    reports, notes = find_reports(args.dirs, every=args.all)
    trackers = [parse_track(spec) for spec in unique_specs(args.track)]
    planned = []
    for run_dirs in reports:
        summaries = [report_summary(d) for d in run_dirs]
        problem = pool_problem(run_dirs, summaries)
        if problem:
            raise LogError(problem)
        first = unswept_name(summaries[0]["run"], summaries[0].get("sweep") or {})
        baseline = args.baseline or recipe_baseline(run_dirs[0]) or first
        if not any(is_baseline(s, baseline) for s in summaries):
            if args.baseline:
                raise ConfigError(f"--baseline {baseline}: no such run; runs are "
                                  f"{baseline_choices(summaries)}")
            notes.append(f"the recipe's baseline {baseline} is not among these runs: "
                         f"speedups against {first}")
            baseline = first
        studies = {d.parent for d in run_dirs}
        out = args.out or _default_out(run_dirs, args.dirs)
        if args.all and args.out:
            out = args.out / run_dirs[0].parent.name
        planned.append((run_dirs, summaries, baseline, output_folder(out),
                        summaries[0]["recipe"] if len(studies) <= 1 else ""))
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)
    failed = 0
    for run_dirs, summaries, baseline, out, title in planned:
        publish(run_dirs, summaries, baseline, out, console, title=title)
        if all("error" in s for s in summaries):
            failed += 1
            console.print(f"every run of this report failed ({len(summaries)} of "
                          f"{len(summaries)}): no results to compare", highlight=False,
                          soft_wrap=True)
    if trackers:
        for run_dirs in reports:
            runs = export_runs(run_dirs, trackers)
            console.print(f"tracked {len(runs)} runs: {', '.join(args.track)}",
                          highlight=False, soft_wrap=True)
        for tracker in trackers:
            tracker.close()
    return 1 if failed else 0


def _default_out(run_dirs: list[Path], dirs: list[Path]) -> Path:
    """Where a report goes without --out: its one study's folder when a DIR is that study
    or holds it, or the report has every run folder of it; else the first DIR, so that a
    report of some of a study's runs never replaces the study's table.csv and plots."""
    studies = {d.parent for d in run_dirs}
    if len(studies) == 1:
        study = next(iter(studies))
        every = {found.parent.resolve() for found in study.glob("*/recipe.json")}
        if every <= {d.resolve() for d in run_dirs} or any(
                study.resolve().is_relative_to(d.resolve()) for d in dirs):
            return study
    return dirs[0]


def _run(args: argparse.Namespace) -> int:
    """``run``: start the child processes the recipe's virtual runs will want, then import
    the runner (and torch) while they import theirs, then run the recipe."""
    from asyncsync.study.children import Spares, children_needed

    overrides = _overrides(args)
    local = args.executor != "slurm"
    if not local and args.jobs:  # Slurm runs the array's tasks
        raise ConfigError("--jobs is for --executor local; with slurm: --slurm-array-parallelism")
    given = slurm_given(args)
    if local and given:
        raise ConfigError(f"{', '.join(given)}: only with --executor slurm (this run is "
                          "local: --jobs sets how many runs at once)")
    jobs = args.jobs or len(os.sched_getaffinity(0))
    spares = Spares.start(children_needed(args.recipe, overrides, args.only, args.repeats,
                                          jobs) if local else 0)
    try:
        from asyncsync.study.executors import SlurmOptions
        from asyncsync.study.runner import run_recipe_file

        unset = SlurmOptions()
        slurm = SlurmOptions(args.slurm_partition, args.slurm_time or unset.time_min,
                             args.slurm_cpus or unset.cpus, args.slurm_gpus or unset.gpus,
                             args.slurm_array_parallelism)
        summaries = run_recipe_file(args.recipe, overrides, args.only, args.logs,
                                    repeats=args.repeats, live=False if args.plain else None,
                                    track=args.track, jobs=jobs, resume=args.resume,
                                    slurm=None if local else slurm, wait=not args.no_wait,
                                    spares=spares)
    finally:
        spares.close()
    return 1 if any("error" in s for s in summaries) else 0


def main(argv: list[str] | None = None) -> int:
    if "" not in sys.path and os.getcwd() not in sys.path:
        # as `python -m asyncsync` (and so a study's child processes) has it: a recipe's
        # model "module:callable" is found in the working directory by the installed
        # command too, whose own folder is sys.path[0]
        sys.path.insert(0, os.getcwd())
    console = make_console()
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "simulate":
            import torch

            from asyncsync.study.executors import run_folder, serve, status_printer

            torch.set_num_threads(1)
            if args.serve:
                serve(sys.stdin)
                return 0
            if args.run_dir is None:
                raise ConfigError("simulate needs RUN_DIR (or --serve)")
            status = status_printer() if args.status else None
            return 0 if run_folder(str(args.run_dir), args.calibrated_s, status) else 1
        if args.command == "check":
            from asyncsync.study.assembly import dataset_loader
            from asyncsync.study.describe import (
                check_table,
                population_table,
                shards_table,
                step_time_table,
            )
            from asyncsync.study.recipe import load_recipe
            from asyncsync.study.run_one import check_data, check_models, device_problem

            recipe = load_recipe(args.recipe, _overrides(args), args.only, args.repeats)
            refuse_missing((), recipe.tracking, str(args.recipe))
            datasets = dataset_loader()  # each loaded once, for the checks and the tables
            check_models(recipe, datasets)
            console.print(check_table(recipe, console.width))
            check_data(recipe, datasets)
            if problem := device_problem(recipe):
                console.print(f"note: {problem}: `asyncsync run` refuses it on this host (a "
                              "Slurm task's node may have the device)", markup=False,
                              highlight=False)
            console.print(step_time_table(recipe, datasets))
            console.print(shards_table(recipe, datasets))
            if (population := population_table(recipe)) is not None:
                console.print(population)
            console.print(f"{args.recipe}: ok ({_what_runs(recipe)}; data found)",
                          highlight=False, soft_wrap=True)
        elif args.command == "traces":
            from asyncsync.hetero.fedscale import convert

            console.print(escape(convert(args.kind, args.source, args.out, args.horizon_s,
                                         args.workers, args.seed)), highlight=False)
        elif args.command == "protocols":
            from asyncsync.study.describe import print_protocols

            print_protocols(console)
        elif args.command == "devices":
            from asyncsync.study.describe import devices_table

            console.print(devices_table())
        elif args.command == "worker-token":
            from asyncsync.transport.tokens import worker_token

            run_token = os.environ.get(TOKEN_ENV)
            if not run_token:
                raise ConfigError(f"worker-token needs the run token in {TOKEN_ENV}")
            print(worker_token(run_token))
        elif args.command == "report":
            return _report(args, console)
        elif args.command == "data":
            from asyncsync.study.prepare import prepare_dataset

            console.print(escape(prepare_dataset(args.name, args.root, system_dir=args.source,
                                                 download=not args.no_download)),
                          highlight=False, soft_wrap=True)
        else:
            import torch

            from asyncsync.study.node_commands import node_command

            torch.set_num_threads(1)
            asyncio.run(node_command(args))
    except InputError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False,
                      soft_wrap=True)
        return 2
    except OSError as exc:  # a file or directory the command could not use
        name = exc.filename
        where = f"{os.fsdecode(name) if isinstance(name, bytes) else name}: " if name else ""
        console.print(f"[red]error:[/red] {where}{exc.strerror or exc}", highlight=False,
                      soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
