"""Runs a documentation block's commands in order, each in a process of its own, for
tests/test_docs.py.

Every command is a child forked from this process, which has imported the command line,
torch and matplotlib once: an ``asyncsync`` command runs `asyncsync.cli.main` in its child
(with its own globals, signal handlers and exit status, as a fresh interpreter would), any
other command is ``bash -euo pipefail -c COMMAND``. A fresh interpreter per command spent
most of the block's time importing torch again.

Usage: ``python -m tests.doc_commands OUT COMMANDS.json``, where COMMANDS.json is a list
of argument lists (``["asyncsync", ...]`` or ``["bash", "-euo", "pipefail", "-c", CMD]``);
command i's stdout and stderr go to OUT/i.out and OUT/i.err, and its exit status to
OUT/i.rc. It stops at the first command that fails, as the block's reader would.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def _preload() -> None:
    """Import what every ``asyncsync`` command would import on its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import torch  # noqa: F401

    import asyncsync.cli
    import asyncsync.study.describe
    import asyncsync.study.runner  # noqa: F401


def _child(argv: list[str], out: Path, index: int) -> None:
    """In the forked child: run one command with its output in OUT/index.*; never returns."""
    code = 70
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, suffix in ((1, "out"), (2, "err")):
            target = os.open(out / f"{index}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
        if argv[0] != "asyncsync":
            os.execvp(argv[0], argv)
        from asyncsync.cli import main

        sys.argv = argv
        try:
            code = main(argv[1:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(out: Path, commands: list[list[str]]) -> int:
    if any(argv[0] == "asyncsync" for argv in commands):
        _preload()
    # a fork copies only the calling thread: a thread started by an import would be missing
    assert threading.active_count() == 1, threading.enumerate()
    for index, argv in enumerate(commands):
        pid = os.fork()
        if pid == 0:
            _child(argv, out, index)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        (out / f"{index}.rc").write_text(str(code))
        if code != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())))
