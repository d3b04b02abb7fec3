"""The child processes that run a study's virtual runs (``--jobs``), and their early start.

A child (``asyncsync simulate --serve``) has one torch thread and runs prepared run folders
one at a time; it lives for many runs, so a study pays Python's and torch's start-up once
per job, not once per run. That start-up is still the longest part of a short study on a
GPU: a few seconds for ``import torch``, in the supervisor and then again in each child.

So ``asyncsync run`` starts the children it expects to need before it imports torch itself
(`children_needed`, `Spares`): the children's imports and the supervisor's then overlap
instead of following one another. This module, and the command line above it, import no
torch. No result depends on the early start: a child knows nothing of a run until the
supervisor sends it a folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from asyncsync.study.recipe_table import apply_override, read_recipe_table

SERVE = ("-m", "asyncsync", "simulate", "--serve")
"""The arguments of ``python`` that make a child."""


def spawn() -> subprocess.Popen[bytes]:
    """Start a child in a session of its own (a terminal's Ctrl-C reaches only the
    supervisor, which terminates it); it waits for run folders on its stdin."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *SERVE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)


def children_needed(recipe: Path, overrides: Sequence[str], only: Sequence[str],
                    repeats: int | None, jobs: int) -> int:
    """How many children a local ``asyncsync run`` of `recipe` will use, judged from its
    file alone (`read_recipe_table`, ``--set`` applied as a recipe applies it): its
    virtual-clock runs (those named by `only`, if any) times its sweep's points and its
    repeats, at most `jobs`; 0 with one job (the runs then go in the supervisor) or a file
    that does not parse (loading the recipe will say why).

    It is an estimate: the recipe is loaded, and checked, only once torch is imported, and
    it does not know which runs a ``--resume`` finds done. A child too many is closed
    unused; one too few starts when it is needed, as every child did before the early
    start.
    """
    try:
        raw = read_recipe_table(recipe)
        defaults = raw.setdefault("defaults", {})
        for item in overrides:  # --set KEY=VALUE, and --clock as clock="..."
            apply_override(defaults, item)
        clock = defaults.get("clock", "real")
        runs = [run for run in raw.get("runs", [])
                if run.get("clock", clock) == "virtual" and (not only or run.get("name")
                                                             in only)]
        sweep = raw.get("sweep", {})  # one key, a list of values: one run each
        points = len(next(iter(sweep.values()))) if sweep else 1
        count = len(runs) * points * (repeats or int(raw.get("repeats", 1)))
    except (ValueError, AttributeError, TypeError):  # ConfigError is a ValueError
        return 0
    return min(jobs, count) if jobs > 1 else 0


class Spares:
    """Children started ahead of need: `take` hands out one, `close` ends those left."""

    def __init__(self, processes: Sequence[subprocess.Popen[bytes]]) -> None:
        self._processes = list(processes)

    @classmethod
    def start(cls, count: int) -> Spares:
        return cls([spawn() for _ in range(count)])

    def take(self) -> subprocess.Popen[bytes] | None:
        """The next spare still running, or None; one that died waiting (killed, out of
        memory) is dropped, so that no run is handed to it."""
        while self._processes:
            process = self._processes.pop(0)
            if process.poll() is None:
                return process
            _close_pipes(process)
        return None

    def close(self) -> None:
        for process in self._processes:
            process.terminate()
            process.wait()
            _close_pipes(process)
        self._processes = []


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


async def _reader(pipe: IO[bytes]) -> tuple[asyncio.StreamReader, asyncio.ReadTransport]:
    """A stream reading `pipe` on the running event loop, and its transport."""
    reader = asyncio.StreamReader(limit=1 << 26)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader, transport


def ending(code: int) -> str:
    """How a child's process ended, from its exit status (a signal's number, negated):
    ``ended with status 1``, ``was killed by SIGKILL (...)``."""
    if code >= 0:
        return f"ended with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    return f"was killed by {name}" + (" (the out-of-memory killer, or kill -9)"
                                      if -code == signal.SIGKILL else "")


class Child:
    """A started child, its status lines read on the event loop."""

    def __init__(self, process: subprocess.Popen[bytes], stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, pipes: list[asyncio.ReadTransport]) -> None:
        self.process = process
        self.errors: list[str] = []
        self._stdout = stdout
        self._pipes = pipes
        self._drain = asyncio.ensure_future(self._keep_errors(stderr))

    @classmethod
    async def start(cls, spares: Spares | None = None) -> Child:
        """A child from `spares` if one is left, else a new one."""
        process = (spares.take() if spares else None) or spawn()
        assert process.stdout is not None and process.stderr is not None
        stdout, out_pipe = await _reader(process.stdout)
        stderr, err_pipe = await _reader(process.stderr)
        return cls(process, stdout, stderr, [out_pipe, err_pipe])

    async def _keep_errors(self, stderr: asyncio.StreamReader) -> None:
        async for line in stderr:
            self.errors = [*self.errors[-19:], line.decode(errors="replace").rstrip()]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    async def run(self, run_dir: Path, calibrated_s: float | None,
                  on_status: Callable[[dict[str, Any]], None]) -> None:
        """Run one folder, passing its status lines to `on_status`.

        Raises:
            RuntimeError: the child ended before the run did (killed, crashed): how
                (`ending`) and its last line on stderr.
        """
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it ended: said below
            self.process.stdin.write(f"{run_dir}\t{calibrated_s or ''}\n".encode())
            self.process.stdin.flush()
        async for line in self._stdout:
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if "done" in message:
                    return
                on_status(message)
        code = await asyncio.to_thread(self.process.wait)
        await self._drain
        last = next((e for e in reversed(self.errors) if e.strip()), None)
        raise RuntimeError(f"its process {ending(code)}" + (f": {last}" if last else ""))

    async def close(self) -> None:
        """Terminate the child (idle, or on Ctrl-C in the middle of a run)."""
        if self.alive:
            self.process.terminate()
        await asyncio.to_thread(self.process.wait)
        self._drain.cancel()
        await asyncio.gather(self._drain, return_exceptions=True)
        for transport in self._pipes:
            transport.close()
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
