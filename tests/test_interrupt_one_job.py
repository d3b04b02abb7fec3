"""Ctrl-C or SIGTERM ends a study that runs its virtual runs in the supervisor (--jobs 1).

The run's simulation went on in its thread to the end of its budget (a 5,000 virtual s run
was still going 10 minutes after "interrupted" was printed): asyncio waits for its threads
before the process exits. The simulation now stops at its next virtual second.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.test_parallel import recipe, started

LONG_S = 1_000_000
"""A virtual budget this host would take days to simulate."""


@pytest.mark.usefixtures("ctrl_c")
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM],
                         ids=["ctrl-c", "sigterm"])
def test_an_interrupted_study_with_one_job_ends_and_marks_its_run(
        tmp_path: Path, signal_number: int) -> None:
    path = recipe(tmp_path, time_s=LONG_S)
    logs = tmp_path / "logs"
    process = started(path, logs, jobs=1)
    try:
        process.send_signal(signal_number)
        out = process.communicate(timeout=240)[0]  # before: the whole budget, days
    finally:
        process.kill()  # (a no-op once it has ended)
    assert process.returncode == 130, out
    (run_dir,) = [p.parent for p in logs.glob("small/*/*/events.jsonl")]
    assert json.loads((run_dir / "summary.json").read_text())["interrupted"] is True
    sizes = [p.stat().st_size for p in sorted(run_dir.glob("*.jsonl"))]
    time.sleep(2)
    assert [p.stat().st_size for p in sorted(run_dir.glob("*.jsonl"))] == sizes
