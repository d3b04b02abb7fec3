"""The command line's options: the parser of ``asyncsync`` and its subcommands, built
without importing torch (`asyncsync.cli` runs the commands)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from asyncsync.study.launch import DEFAULT_PORT, TOKEN_ENV
from asyncsync.training.catalog import DATASETS

TRACK_HELP = ("tensorboard[=DIR], mlflow[=URI], wandb[=PROJECT] (repeatable; defaults: runs/, "
              "mlruns/, project asyncsync)")


class UsageError(Exception):
    """A command line argparse refused: shown as one ``error:`` line, like any bad input."""


class _Parser(argparse.ArgumentParser):
    """argparse, its refusals raised as `UsageError` instead of a usage block and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (its refusals raised as `UsageError`)."""
    parser = _Parser(
        prog="asyncsync", description="Run, check and report synchronization-protocol "
        "recipes; serve or join one run on several machines.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run every run of a recipe with a live dashboard")
    _recipe_options(run)
    run.add_argument("--logs", type=Path, default=Path("logs"), help="log root (default logs/)")
    run.add_argument("--plain", action="store_true", help="plain progress lines, no live view")
    run.add_argument("--track", action="append", default=[], metavar="SPEC",
                     help="stream the runs to TensorBoard, MLflow or W&B while they run: "
                          + TRACK_HELP)
    run.add_argument("--jobs", type=_positive, default=None,
                     metavar="N", help="virtual-clock runs at once, each in a process of its "
                     "own with one torch thread (1: one after another in this process; "
                     f"default: the usable cores, here {len(os.sched_getaffinity(0))}; results "
                     "are the same for any N); real-clock runs always go one at a time, as "
                     "they measure the host; not with --executor slurm (Slurm runs the tasks: "
                     "--slurm-array-parallelism)")
    run.add_argument("--resume", type=Path, default=None, metavar="LOGDIR",
                     help="continue the study in LOGDIR (logs/RECIPE/STAMP, with the same "
                          "options): run only the runs without a summary.json, or marked "
                          "interrupted, each from its start, then table all of them")
    run.add_argument("--executor", choices=("local", "slurm"), default="local",
                     help="local: on this machine (--jobs); slurm: one Slurm job array, a "
                          "task per virtual run, through submitit (pip install "
                          "asyncsync[slurm]); --logs must be on a filesystem the nodes share")
    slurm = run.add_argument_group("Slurm (with --executor slurm)")
    slurm.add_argument("--slurm-partition", default=None, metavar="NAME",
                       help="partition (default: the cluster's)")
    slurm.add_argument("--slurm-time", type=_positive, default=None, metavar="MIN",
                       help="time limit of each task in minutes (default 60)")
    slurm.add_argument("--slurm-cpus", type=_positive, default=None, metavar="N",
                       help="CPUs per task (default 1)")
    slurm.add_argument("--slurm-gpus", type=_count, default=None, metavar="N",
                       help="GPUs per task (default 0)")
    slurm.add_argument("--slurm-array-parallelism", type=_positive, default=None,
                       metavar="N", help="tasks of the array running at once (default: "
                                         "as many as Slurm allows)")
    slurm.add_argument("--no-wait", action="store_true",
                       help="exit once submitted; then `asyncsync report LOGDIR` (or --resume"
                            " LOGDIR) collects the results")
    run.epilog = ("exit status: 0 every run finished; 1 one or more runs failed (the table "
                  "shows each with its error); 2 a bad recipe, option or path; 130 "
                  "interrupted (Ctrl-C or SIGTERM; --resume continues)")

    check = sub.add_parser("check", help="validate a recipe and print its resolved runs")
    _recipe_options(check)

    simulate = sub.add_parser("simulate", help="simulate one prepared virtual run folder "
                              "(what --jobs and Slurm tasks run): writes its summary.json")
    simulate.add_argument("run_dir", type=Path, nargs="?",
                          help="a run folder with its recipe.json")
    simulate.add_argument("--serve", action="store_true",
                          help="run the folders read from stdin, one a line, each followed "
                               "by its calibrated step time after a tab (what --jobs uses)")
    simulate.add_argument("--calibrated-s", type=float, default=None, metavar="S",
                          help='the step time for base_step_s = "calibrate"')
    simulate.add_argument("--status", action="store_true",
                          help="print the run's status as JSON lines while it runs")

    traces = sub.add_parser("traces", help="convert FedScale's pickled client traces to "
                                           "CSV traces (runs read only CSV)")
    traces.add_argument("action", choices=["convert"], help="convert (the one action)")
    traces.add_argument("kind", choices=["behave", "capacity"],
                        help="client_behave_trace (availability) or client_device_capacity")
    traces.add_argument("source", type=Path, help="FedScale's pickle (plain data only)")
    traces.add_argument("out", type=Path, help="the CSV trace to write")
    traces.add_argument("--horizon-s", type=float, default=86400.0,
                        help="behave: seconds of availability to write (default a day)")
    traces.add_argument("--workers", type=int, default=None,
                        help="behave: draw this many clients as ranks 0..N-1 (default all)")
    traces.add_argument("--seed", type=int, default=0, help="behave: the draw's seed")
    sub.add_parser("protocols", help="list the protocols and their parameters")
    sub.add_parser("devices", help="list the named devices of compute.device, with sources")
    sub.add_parser("worker-token", help=f"print the worker token of the run token in "
                                        f"{TOKEN_ENV} (give it to worker nodes as "
                                        f"ASYNCSYNC_WORKER_TOKEN)")

    report = sub.add_parser("report", help="rebuild the comparison table from run logs")
    report.add_argument("dirs", type=Path, nargs="+", metavar="DIR",
                        help="log folders: a study (logs/RECIPE/STAMP), a run's folder, or "
                             "a log root such as logs")
    report.add_argument("--baseline", default=None, help="run to compare against "
                        "(name or recipe/name; default: the recipe's baseline)")
    report.add_argument("--out", type=Path, default=None,
                        help="where to write table.csv and plots (default: the study's "
                             "directory when a DIR is the study or holds it, or the report "
                             "has all its runs; else the first DIR)")
    report.add_argument("--all", action="store_true",
                        help="report every study under the DIRs separately (default: the "
                             "latest study of each recipe)")
    report.add_argument("--track", action="append", default=[], metavar="SPEC",
                        help="also send the reported runs to TensorBoard, MLflow or W&B: "
                             + TRACK_HELP)
    report.epilog = ("exit status: 0 reported; 1 every run of a report failed (the table "
                     "shows each error); 2 a bad folder, option or log")

    data = sub.add_parser("data", help="prepare a real dataset under --root, offline first: "
                          "the files already there, else a system package's (Debian's "
                          "dataset-fashion-mnist), else torchvision's download")
    data.add_argument("name", metavar="NAME", help=f"one of {', '.join(DATASETS)}")
    data.add_argument("--root", type=Path, default=Path("data"), metavar="DIR",
                      help="the recipes' data.root (default data)")
    data.add_argument("--from", dest="source", type=Path, default=None, metavar="DIR",
                      help="a folder holding the four gzipped IDX files of mnist or "
                           "fashion_mnist (default for fashion_mnist: "
                           "/usr/share/datasets/fashion-mnist)")
    data.add_argument("--no-download", action="store_true",
                      help="never use the network: fail if no local source has the files")

    for name, text in (("server", "start the parameter server of one run"),
                       ("worker", "start one worker of one run"),
                       ("launch", "start this task's node from RANK/WORLD_SIZE/MASTER_ADDR "
                                  "(torchrun) or SLURM_PROCID/SLURM_NTASKS: rank 0 serves")):
        node = sub.add_parser(name, help=text)
        node.add_argument("--recipe", type=Path, required=True,
                          help="the recipe's TOML file (or a run's recipe.json)")
        node.add_argument("--run", default=None, help="run name (needed if several)")
        node.add_argument("--run-id", default=None, help="shared id of this run's nodes "
                          "(default: RECIPE/RUN)")
        node.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                          help="write this node's logs here (default: none)")
        if name == "server":
            node.add_argument("--host", default="127.0.0.1",
                              help="address to listen on (default 127.0.0.1)")
            node.add_argument("--port", type=_port, default=None,
                              help=f"0-65535, 0: any free port (default: MASTER_PORT or "
                                   f"{DEFAULT_PORT})")
        if name == "worker":
            node.add_argument("--server", default=None,
                              help="the server's URL (default: from MASTER_ADDR/MASTER_PORT)")
            node.add_argument("--rank", type=int, default=None,
                              help="worker rank (default: launcher's global rank - 1)")
        if name in ("server", "launch"):
            node.add_argument("--resume", action="store_true",
                              help="continue from the checkpoint in --log-dir")
            node.add_argument("--port-file", type=Path, default=None,
                              help="write the bound port here once listening")
            node.add_argument("--tls-cert", type=Path, default=None,
                              help="serve https with this PEM certificate chain (with "
                                   "--tls-key; default: the recipe's tls.cert)")
            node.add_argument("--tls-key", type=Path, default=None,
                              help="the certificate's PEM private key (default: tls.key)")
        if name in ("worker", "launch"):
            node.add_argument("--bind", default=None,
                              help="local address to connect from (e.g. 127.0.0.3)")
            node.add_argument("--tls-ca", type=Path, default=None,
                              help="verify the https server against this PEM CA "
                                   "certificate (default: the recipe's tls.ca, else the "
                                   "system's trust store)")
    return parser


SLURM_OPTIONS = ("--slurm-partition", "--slurm-time", "--slurm-cpus", "--slurm-gpus",
                 "--slurm-array-parallelism", "--no-wait")
"""``run``'s options for ``--executor slurm``. Unset, each parses as None (False), so that
one given with the local executor is refused by name rather than ignored; the defaults
the help names are `asyncsync.study.executors.SlurmOptions`'s."""


def slurm_given(args: argparse.Namespace) -> list[str]:
    """The Slurm options given on the command line (`SLURM_OPTIONS`)."""
    values = {option: getattr(args, option[2:].replace("-", "_")) for option in SLURM_OPTIONS}
    return [option for option, value in values.items()
            if value is not None and value is not False]  # (--slurm-gpus 0 is given too)


def _recipe_options(parser: argparse.ArgumentParser) -> None:
    """The recipe and the options that select and change its runs (``run``, ``check``)."""
    parser.add_argument("recipe", type=Path, help="a recipe's TOML file (or a run's "
                        "recipe.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override defaults.KEY (TOML value syntax; "
                        "repeatable)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this run (repeatable)")
    parser.add_argument("--repeats", type=int, default=None, metavar="K",
                        help="every run K times, seeds seed..seed+K-1 (default: the "
                             "recipe's repeats, else 1)")
    parser.add_argument("--clock", choices=("real", "virtual"), default=None,
                        help="every run on this clock (default: the recipe's, else real)")


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`."""

    def parse(text: str) -> int:
        value = int(text) if text.strip().removeprefix("-").isdecimal() else low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
        return value

    return parse


_positive, _count = _at_least(1), _at_least(0)


def _port(text: str) -> int:
    """An argparse type: a TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return value
