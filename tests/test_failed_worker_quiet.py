"""A virtual run whose worker raises ends with that error alone: its other workers are
cancelled and awaited before the loop closes. They were left pending, and the error was
followed by a page of "Task was destroyed but it is pending!" and "coroutine ignored
GeneratorExit" warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
from asyncsync.engine.settings import ServerSettings
from asyncsync.study.simulation import run_virtual
from tests.helpers import batches_of, tiny_data, tiny_model

x, y = tiny_data()
steps = [0]


def model():
    module = tiny_model()
    forward = module.forward

    def failing(inputs):
        if module.training:
            steps[0] += 1
            if steps[0] == 30:
                raise RuntimeError("a worker's step failed")
        return forward(inputs)

    module.forward = failing
    return module


try:
    run_virtual("asp", model, lambda rank: batches_of(x, y, rank), [0.0, 0.0, 0.01],
                settings=ServerSettings(time_s=5.0))
except RuntimeError as exc:
    print("raised:", exc)
import gc
gc.collect()
"""


def test_a_failed_worker_ends_the_run_with_its_error_alone() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "raised: a worker's step failed"
    assert done.stderr == "", done.stderr[-3000:]
