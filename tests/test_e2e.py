"""End to end through the CLI in a subprocess: the quickstart recipe, small and short."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.doc_pages import named_block

ROOT = Path(__file__).parent.parent
SUMMARY_FIELDS = {
    "run", "protocol", "workers", "wall_s", "time_to_target_s", "best_accuracy",
    "final_accuracy", "compute_proportion", "compute_proportion_per_worker", "samples_per_s",
    "bytes_up", "bytes_down", "versions", "mean_staleness",
}
TARGET = 0.25
"""The e2e run's target accuracy: well above the untrained model's (0.1, 10 classes)."""
CAP_S = 100
"""Its time budget, a cap only: with this process held to 0.3 of a core, bsp reached 0.25
after 12 s (33 versions), asp after 13 s."""


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "asyncsync", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
    """The quickstart as `make run` runs it, stopping at a target, smaller: 3 workers to
    0.25 test accuracy. The run is ended by its target, not by a time budget, so how much
    it learns does not depend on the host's load (a fixed 6 s budget once asked for +0.05
    accuracy, which bsp missed at load 8: 16 versions, +0.047); the budget is only a cap."""
    logs = tmp_path / "logs"
    done = cli("run", str(ROOT / "recipes" / "quickstart.toml"), "--logs", str(logs),
               "--set", "workers=3", "--set", f"stop.time_s={CAP_S}", "--set",
               "eval.interval_s=1", "--set", "compute.slowdown=[1, 1, 2]",
               "--set", f"stop.target_accuracy={TARGET}", "--set", "stop.stop_at_target=true")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "quickstart: comparison (baseline bsp)" in out
    assert re.search(r"\[bsp\] t=\d+s v=\d+ acc=", out), out  # plain progress lines
    (stamp,) = (logs / "quickstart").iterdir()
    assert json.loads((stamp / "recipe.json").read_text())["baseline"] == "bsp"
    for name in ("table.csv", "accuracy.png", "compute_proportion.png", "timeline-bsp.png"):
        assert (stamp / name).exists(), name
    for run, protocol in (("bsp", "bsp"), ("asp", "asp")):
        run_dir = stamp / run
        for name in ("recipe.json", "events.jsonl", "summary.json", "server.log",
                     "worker-0.jsonl", "worker-2.jsonl"):
            assert (run_dir / name).exists(), name
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary.keys() >= SUMMARY_FIELDS
        assert summary["protocol"] == protocol and summary["workers"] == 3
        # it learned, from the untrained model's first evaluation (near chance, 0.1) to the
        # target, and stopped there: after the evaluation that reached it only the stop's
        # own evaluation of the final model follows, long before the cap
        evaluations, reached = summary["evaluations"], summary["time_to_target_s"]
        assert evaluations[0][1] < 0.15 and reached is not None, summary
        assert summary["best_accuracy"] >= TARGET
        assert [t for t, _ in evaluations if t > reached] in ([], [summary["wall_s"]]), summary
        assert reached <= summary["wall_s"] < CAP_S, summary
        assert summary["versions"] > 10
        assert len(summary["compute_proportion_per_worker"]) == 3
        assert 0 < summary["compute_proportion"] <= 1
    bsp = json.loads((stamp / "bsp" / "summary.json").read_text())
    asp = json.loads((stamp / "asp" / "summary.json").read_text())
    assert bsp["mean_staleness"] == 0
    assert asp["mean_staleness"] > 0
    report = cli("report", str(logs / "quickstart"), "--baseline", "bsp")
    assert report.returncode == 0
    assert "bsp" in report.stdout and "asp" in report.stdout


def test_check_reports_bad_recipe_keys(tmp_path: Path) -> None:
    done = cli("check", str(ROOT / "recipes" / "quickstart.toml"), "--set", "stop.time_s=0")
    assert done.returncode == 2
    assert "defaults.stop.time_s: must be > 0" in done.stdout
    good = cli("check", str(ROOT / "recipes" / "quickstart.toml"))
    assert good.returncode == 0 and "ok (2 runs, baseline bsp; data found)" in good.stdout


def test_protocols_lists_registered_protocols() -> None:
    done = cli("protocols")
    assert done.returncode == 0
    assert "bsp:" in done.stdout and "asp:" in done.stdout


def test_embedding_example_from_the_docs_runs(tmp_path: Path) -> None:
    code = named_block("embedding-example")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    steps = re.search(r"steps per worker: \[(\d+), (\d+)\]", done.stdout)
    accuracy = re.search(r"accuracy: ([0-9.]+)", done.stdout)
    assert steps and accuracy, done.stdout
    assert int(steps.group(1)) > 20
    assert float(accuracy.group(1)) > 0.6  # 4 classes: chance is 0.25
