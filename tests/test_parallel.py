"""Studies in parallel (--jobs), resumed (--resume), contained failures, and Slurm arrays
through submitit's local executor: the folders and the table equal those of --jobs 1, and
the trackers follow every run of a parallel study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncsync.cli import main
from asyncsync.study import runner
from asyncsync.study.executors import shared_problem
from asyncsync.study.simulation import REAL_TIME_FIELDS
from asyncsync.tracking.feed import figures, run_dirs_of
from tests.test_tracking import evaluations, inspect, scalars, summary_of

ROOT = Path(__file__).parent.parent

RECIPE = """
name = "small"
baseline = "bsp"
repeats = 2

[defaults]
workers = 3
clock = "virtual"

[defaults.stop]
time_s = {time_s}
target_accuracy = 0.6

[defaults.model]
name = "mlp"

[defaults.eval]
interval_s = 2

[defaults.compute]
base_step_s = 0.1
slowdown = [1, 1, 2]

[[runs]]
name = "bsp"
protocol = "bsp"

[[runs]]
name = "asp"
protocol = "asp"
"""
RUNS = ["bsp-r0", "bsp-r1", "asp-r0", "asp-r1"]
STUDY_TIME_S = 30
"""The virtual seconds of every study here: about 6 real s a run, so that a signal sent
once a run has written events lands while runs are in progress."""


def recipe(tmp: Path, time_s: int = STUDY_TIME_S) -> str:
    path = tmp / "small.toml"
    path.write_text(RECIPE.format(time_s=time_s))
    return str(path)


def run_cli(*args: str, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncsync", "run", *args, "--plain"],
                          cwd=cwd, env={**os.environ, "COLUMNS": "160", "PYTHONPATH": str(ROOT),
                                        **(env or {})},
                          capture_output=True, text=True, timeout=600)


def study(logs: Path) -> Path:
    (root,) = (logs / "small").iterdir()
    return root


def outcome(root: Path) -> dict[str, object]:
    """Every deterministic file of a study: the runs' logs, summaries (less real time) and
    the table."""
    files: dict[str, object] = {"table.csv": (root / "table.csv").read_text()}
    for name in RUNS:
        run_dir = root / name
        for path in [run_dir / "events.jsonl", *sorted(run_dir.glob("worker-*.jsonl"))]:
            files[f"{name}/{path.name}"] = path.read_bytes()
        summary = json.loads((run_dir / "summary.json").read_text())
        files[f"{name}/summary.json"] = {k: v for k, v in summary.items()
                                         if k not in REAL_TIME_FIELDS}
    return files


def offline_wandb_env(tmp_path: Path) -> dict[str, str]:
    """W&B offline, its config, cache and data under `tmp_path`/home (skips without W&B or
    TensorBoard, the dev extra's trackers)."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    pytest.importorskip("wandb", reason="wandb not installed (the track extra)")
    home = str(tmp_path / "home")
    return {"WANDB_CONFIG_DIR": home, "WANDB_CACHE_DIR": home, "WANDB_DATA_DIR": home,
            "WANDB_MODE": "offline"}


def assert_tensorboard_has_every_run(where: Path, root: Path) -> None:
    """Each run's evaluations and best accuracy, as TensorBoard's reader sees them."""
    for run_dir in run_dirs_of(root):
        name, repeat = run_dir.name.split("-")
        folder = where / root.parent.name / root.name / name / repeat
        assert [step for step, _ in scalars(folder, "accuracy")] == [
            v for v, _, _ in evaluations(run_dir)]
        (last,) = scalars(folder, "summary/best_accuracy")
        assert last == (summary_of(run_dir)["versions"],
                        pytest.approx(summary_of(run_dir)["best_accuracy"]))


def assert_wandb_has_every_run(where: Path, root: Path) -> None:
    """One finished offline W&B run per run, its history every evaluation."""
    offline = sorted(where.glob("offline-run-*"))
    assert len(offline) == len(RUNS)
    by_id = {}
    for folder in offline:
        records = inspect(folder)
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        by_id[run["config"]["update"]["run_id"]] = (records, inspect(folder, "--summary"))
    for run_dir in run_dirs_of(root):
        records, summary = by_id[f"{root.parent.name}/{root.name}/{run_dir.name}"]
        rows = [r["history"]["item"] for r in records if r["type"] == "history"]
        assert [(row["version"], row["accuracy"]) for row in rows] == [
            (v, a) for v, a, _ in evaluations(run_dir)]
        assert summary["state"] == "finished"
        assert summary["summary"]["best_accuracy"] == pytest.approx(
            figures(summary_of(run_dir))["best_accuracy"])


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The small study run with --jobs 1 (in this process's threads, as before --jobs):
    what --jobs 2, a Slurm array and a resumed study must each write."""
    tmp = tmp_path_factory.mktemp("sequential")
    assert main(["run", recipe(tmp), "--logs", str(tmp / "logs"), "--jobs", "1",
                 "--plain"]) == 0
    return outcome(study(tmp / "logs"))


def test_jobs_2_writes_the_same_folders_and_table_as_jobs_1_and_tracks_each_run(
        sequential: dict[str, object], tmp_path: Path) -> None:
    """Tracked as it goes, to TensorBoard and W&B (offline): each tracker follows every run
    to its end, read back with the tool's own reader, and tracking changes no log."""
    wandb = offline_wandb_env(tmp_path)
    done = run_cli(recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--jobs", "2",
                   "--track", f"tensorboard={tmp_path / 'tb'}", "--track", "wandb=small",
                   env=wandb, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    root = study(tmp_path / "logs")
    assert outcome(root) == sequential
    assert "4/4 runs done" in done.stdout or "[4/4]" in done.stdout
    assert_tensorboard_has_every_run(tmp_path / "tb", root)
    assert_wandb_has_every_run(tmp_path / "wandb", root)


def test_a_slurm_array_writes_the_same_folders_and_table_as_jobs_1_and_is_tracked(
        sequential: dict[str, object], tmp_path: Path) -> None:
    """Without srun on the PATH, submitit runs the array's tasks as local processes (the
    PATH holds only this Python's folder, so a Slurm installed here is not seen); each
    task sends its run to TensorBoard."""
    done = run_cli(recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--executor", "slurm",
                   "--slurm-time", "10", "--track", f"tensorboard={tmp_path / 'tb'}",
                   env={"PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0, done.stdout + done.stderr
    root = study(tmp_path / "logs")
    assert "submitted 4 runs as job array" in done.stdout
    submitted = json.loads((root / "submitted.json").read_text())
    assert submitted["runs"] == RUNS and submitted["cluster"] == "local"
    assert outcome(root) == sequential
    assert_tensorboard_has_every_run(tmp_path / "tb", root)


def test_slurm_without_submitit_is_one_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "submitit", None)  # an import of it fails
    code = main(["run", recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--plain",
                 "--executor", "slurm"])
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("error:")]
    assert code == 2
    assert lines == ["error: --executor slurm needs submitit: pip install asyncsync[slurm]"]


def test_a_run_that_raises_is_a_failed_row_and_the_others_finish(tmp_path: Path) -> None:
    """asp "diverges" (raises, through a sitecustomize in its process): its row says so
    with the error's first line, bsp's rows are there, the exit status is 1."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import asyncsync.study.simulation as simulation\n"
        "real = simulation.simulate\n"
        "def simulate(spec, *args, **kwargs):\n"
        "    if spec.name == 'asp':\n"
        "        raise FloatingPointError('asp diverged\\nat step 3')\n"
        "    return real(spec, *args, **kwargs)\n"
        "simulation.simulate = simulate\n")
    done = run_cli(recipe(tmp_path), "--logs", str(tmp_path / "logs"), "--jobs", "2",
                   env={"PYTHONPATH": str(hooks)})
    assert done.returncode == 1, done.stdout + done.stderr
    root = study(tmp_path / "logs")
    for name in ("asp-r0", "asp-r1"):
        summary = json.loads((root / name / "summary.json").read_text())
        assert summary["error"] == "FloatingPointError: asp diverged"
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["asp-r0", "failed:", "FloatingPointError:", "asp", "diverged"] in [
        row[1:] for row in rows]
    assert any(row[:3] == ["asp", "asp", "failed:"] for row in rows), done.stdout
    assert "best_accuracy" in json.loads((root / "bsp-r1" / "summary.json").read_text())
    assert "1 one or more runs failed" in " ".join(
        run_cli("--help").stdout.split())


def started(path: str, logs: Path, jobs: int) -> subprocess.Popen[str]:
    """`asyncsync run` of the recipe at `path` with `jobs`, once a run has written events
    (its output is piped: read it with ``communicate``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncsync", "run", path, "--logs", str(logs), "--jobs",
         str(jobs), "--plain"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "COLUMNS": "160"})
    while not any(p.stat().st_size for p in logs.glob("small/*/*/events.jsonl")):
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.2)
    return process


@pytest.mark.usefixtures("ctrl_c")
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_with_jobs_marks_the_runs_in_progress_and_resume_finishes_the_study(
        tmp_path: Path, signal_number: int, sequential: dict[str, object]) -> None:
    """Ctrl-C, or SIGTERM (a Slurm time limit, `kill`), while two children run: exit 130,
    their folders marked interrupted (not failed) and their logs no longer growing;
    --resume (after Ctrl-C: the two signals leave the same folders) runs exactly the
    unfinished runs, and its table and folders equal those of a study run in one go."""
    path = recipe(tmp_path)
    logs = tmp_path / "logs"
    process = started(path, logs, jobs=2)
    process.send_signal(signal_number)
    out = process.communicate(timeout=120)[0]
    assert process.returncode == 130, out
    root = study(logs)
    assert "interrupted" in out and f"asyncsync run {path} --resume {root}" in " ".join(out.split())
    written = {d.name: json.loads((d / "summary.json").read_text()) for d in root.iterdir()
               if d.is_dir() and (d / "summary.json").exists()}
    cut = [root / name for name, summary in written.items() if summary.get("interrupted")]
    assert cut, out
    failed = {name: s["error"] for name, s in written.items()
              if "error" in s and not s.get("interrupted")}
    assert not failed, out  # --resume would not run a failed run again
    # (a run the Ctrl-C caught before its child began has no events.jsonl yet)
    events = [d / "events.jsonl" for d in cut if (d / "events.jsonl").exists()]
    assert events, out
    sizes = [p.stat().st_size for p in events]
    time.sleep(2)
    assert [p.stat().st_size for p in events] == sizes  # the children are gone
    if signal_number == signal.SIGTERM:
        return
    resumed = run_cli(path, "--logs", str(logs), "--jobs", "2", "--resume", str(root))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming {root}: " in " ".join(resumed.stdout.split())
    assert outcome(root) == sequential


def test_a_supervisor_killed_outright_leaves_its_runs_interrupted_not_failed(
        tmp_path: Path) -> None:
    """SIGKILL (the OOM killer, a lost login node): no handler runs in the supervisor, and
    its children notice only when their next status line finds the pipe broken. The runs
    they were simulating must then be marked interrupted, which --resume runs again, not
    failed with a BrokenPipeError, which it keeps; and the children must stop."""
    logs = tmp_path / "logs"
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncsync", "run", recipe(tmp_path, time_s=200), "--logs",
         str(logs), "--jobs", "2", "--plain"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    while not any(p.stat().st_size for p in logs.glob("small/*/*/events.jsonl")):
        assert process.poll() is None
        time.sleep(0.2)
    process.kill()
    process.wait()
    root = study(logs)
    started = [d for d in root.iterdir() if (d / "events.jsonl").exists()]
    deadline = time.monotonic() + 120
    while not all((d / "summary.json").exists() for d in started):
        assert time.monotonic() < deadline, [d.name for d in started]
        time.sleep(0.5)
    for run_dir in started:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary.get("interrupted") is True, summary
    events = [d / "events.jsonl" for d in started]
    sizes = [p.stat().st_size for p in events]
    time.sleep(2)
    assert [p.stat().st_size for p in events] == sizes  # the children stopped


def test_resume_keeps_finished_runs_and_refuses_other_options(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = recipe(tmp_path, time_s=6)
    logs = tmp_path / "logs"
    assert main(["run", path, "--logs", str(logs), "--jobs", "1", "--plain"]) == 0
    root = study(logs)
    kept = (root / "bsp-r0" / "summary.json").stat().st_mtime_ns
    (root / "asp-r1" / "summary.json").unlink()  # as if its node was lost
    capsys.readouterr()
    assert main(["run", path, "--logs", str(logs), "--jobs", "1", "--plain",
                 "--resume", str(root)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"resuming {root}: 3 of 4 runs done, 1 to run" in out
    assert (root / "bsp-r0" / "summary.json").stat().st_mtime_ns == kept
    assert "best_accuracy" in json.loads((root / "asp-r1" / "summary.json").read_text())
    assert main(["run", path, "--logs", str(logs), "--plain", "--resume", str(root),
                 "--set", "stop.time_s=7"]) == 2
    assert "its recipe.json differs from small" in " ".join(capsys.readouterr().out.split())


def test_two_studies_started_in_one_second_get_folders_of_their_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runner.time, "strftime", lambda _: "20260101-000000")
    first, second = runner._new_study(tmp_path), runner._new_study(tmp_path)
    assert (first.name, second.name) == ("20260101-000000", "20260101-000000-2")


def test_a_log_root_under_tmp_is_flagged_as_not_shared(tmp_path: Path) -> None:
    problem = shared_problem(Path("/tmp/logs"))
    assert problem is not None and "/tmp" in problem
