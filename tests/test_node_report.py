"""A run started by hand (`asyncsync server --log-dir DIR` and its workers) leaves what
`asyncsync report DIR` tables: the run's resolved recipe.json, as `asyncsync run` writes it,
and a summary.json once the run ended."""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsync.study.node_commands import run_record
from asyncsync.study.recipe import load_recipe
from tests.test_cli import run_main
from tests.test_node_errors import start_server

pytestmark = pytest.mark.xdist_group("real-clock")  # a server and workers, for seconds

RECIPE = """
name = "hand"
[defaults]
workers = 2
seed = 3
[defaults.stop]
time_s = 2
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 0.5
[[runs]]
name = "net"
protocol = "bsp"
[[runs]]
name = "other"
protocol = "asp"
"""


def test_a_hand_started_run_can_be_reported(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    recipe = tmp_path / "hand.toml"
    recipe.write_text(RECIPE)
    log_dir = tmp_path / "study" / "net"
    log_dir.mkdir(parents=True)
    common = ["--recipe", str(recipe), "--run", "net", "--log-dir", str(log_dir)]
    server, url = start_server(recipe, log_dir, {}, "--run", "net")
    workers = [subprocess.Popen([sys.executable, "-m", "asyncsync", "worker", *common,
                                 "--server", url, "--rank", str(rank)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
               for rank in range(2)]
    try:
        for worker in workers:
            out, _ = worker.communicate(timeout=120)
            assert worker.returncode == 0, out
        assert server.wait(timeout=120) == 0
    finally:
        for process in (server, *workers):
            if process.poll() is None:
                process.kill()
                process.wait()
    spec = load_recipe(recipe).run("net")
    assert json.loads((log_dir / "recipe.json").read_text()) == json.loads(json.dumps(
        {"name": "hand", "baseline": "net", "repeat": 0, "runs": [spec.as_table()]}))
    assert (log_dir / "summary.json").exists()
    code, out = run_main(capsys, "report", str(log_dir))
    assert code == 0, out
    assert "net" in out and "no run logs" not in out
    with (tmp_path / "study" / "table.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert [(r["recipe"], r["run"], r["protocol"], r["workers"]) for r in rows] == [
        ("hand", "net", "bsp", "2")]
    assert float(rows[0]["samples_per_s"]) > 0  # from the workers' logs, in the same folder


def test_a_run_of_asyncsync_run_keeps_the_runners_recipe_json(tmp_path: Path) -> None:
    """`asyncsync run` starts the server with its run folder's recipe.json as --recipe and
    writes that folder's recipe.json and summary.json itself."""
    prepared = tmp_path / "recipe.json"
    prepared.write_text("{}")
    args = argparse.Namespace(recipe=tmp_path / "." / "recipe.json", log_dir=tmp_path)
    assert run_record(args) is None
    assert run_record(argparse.Namespace(recipe=tmp_path / "r.toml", log_dir=None)) is None
    assert run_record(argparse.Namespace(recipe=tmp_path / "r.toml",
                                         log_dir=tmp_path)) == tmp_path
