"""A disk that fills up as a run's summary.json is written (here a file-size limit, as
tests/test_s11_rounds2_trace_writes.py cuts a trace): the error names summary.json (a
failed write() names no file: the command said only "error: File too large") and no
partial summary.json.tmp is left in the run's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_s12_study3_jobs_tracker import RECIPE

FULL_AT_THE_SUMMARY = """
import resource, signal, sys
from asyncsync.study import executors
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
write = executors.write_summary

def full(run_dir, summary):
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))  # the logs are written by now
    write(run_dir, summary)

executors.write_summary = full
try:
    executors.run_folder(sys.argv[1])
except OSError as exc:
    print(exc.errno, exc.filename)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_summary_cut_short_names_its_file_and_leaves_no_partial(tmp_path: Path) -> None:
    from asyncsync.study.recipe import load_recipe
    from asyncsync.study.run_one import prepare_folder

    (tmp_path / "small.toml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "small.toml", ["stop.time_s=2"])
    run_dir = tmp_path / "bsp-r0"
    prepare_folder(recipe.runs[0], recipe, run_dir, 0)
    done = subprocess.run([sys.executable, "-c", FULL_AT_THE_SUMMARY, str(run_dir)],
                          capture_output=True, text=True, check=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.stdout.split() == ["27", str(run_dir / "summary.json")], done.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "events.jsonl", "recipe.json", "worker-0.jsonl", "worker-1.jsonl", "worker-2.jsonl"]
