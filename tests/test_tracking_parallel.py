"""Tracking a study whose runs go in parallel (``--jobs 2``) or as a Slurm array: every
tracker follows each of 2 runs x 2 repeats to the end, read back with the tool's reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncsync import cli
from asyncsync.tracking.feed import figures, run_dirs_of
from tests.test_tracking import (
    RECIPE,
    evaluations,
    inspect,
    offline_wandb,
    scalars,
    summary_of,
)


def run_study(tmp_path: Path, *options: str) -> Path:
    """The 2 x 2 study through the CLI with `options`; its folder."""
    recipe = tmp_path / "trk.toml"
    recipe.write_text(RECIPE)
    assert cli.main(["run", str(recipe), "--plain", "--repeats", "2", "--logs",
                     str(tmp_path / "logs"), *options]) == 0
    (root,) = (tmp_path / "logs" / "trk").iterdir()
    assert sorted(r.name for r in run_dirs_of(root)) == [
        "asp-r0", "asp-r1", "bsp-r0", "bsp-r1"]
    return root


def assert_tensorboard_has_every_run(where: Path, root: Path) -> None:
    for run_dir in run_dirs_of(root):
        name, repeat = run_dir.name.split("-")
        folder = where / "trk" / root.name / name / repeat
        assert [step for step, _ in scalars(folder, "accuracy")] == [
            v for v, _, _ in evaluations(run_dir)]
        (last,) = scalars(folder, "summary/best_accuracy")
        assert last == (summary_of(run_dir)["versions"],
                        pytest.approx(summary_of(run_dir)["best_accuracy"]))


def test_parallel_runs_are_each_tracked_in_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    offline_wandb(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    root = run_study(tmp_path, "--jobs", "2", "--track", f"tensorboard={tmp_path / 'tb'}",
                     "--track", "wandb=trk-project")
    assert_tensorboard_has_every_run(tmp_path / "tb", root)
    offline = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 4
    by_id = {}
    for folder in offline:
        records = inspect(folder)
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        by_id[run["config"]["update"]["run_id"]] = (records, inspect(folder, "--summary"))
    for run_dir in run_dirs_of(root):
        records, summary = by_id[f"trk/{root.name}/{run_dir.name}"]
        rows = [r["history"]["item"] for r in records if r["type"] == "history"]
        assert [(row["version"], row["accuracy"]) for row in rows] == [
            (v, a) for v, a, _ in evaluations(run_dir)]
        assert summary["state"] == "finished"
        assert summary["summary"]["best_accuracy"] == pytest.approx(
            figures(summary_of(run_dir))["best_accuracy"])


def test_parallel_runs_are_each_tracked_in_mlflow(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (the track extra)")
    from asyncsync.tracking.mlflow_tracker import store_uri

    root = run_study(tmp_path, "--jobs", "2", "--track", f"mlflow={tmp_path / 'store'}")
    client = mlflow.MlflowClient(tracking_uri=store_uri(str(tmp_path / "store")))
    experiment = client.get_experiment_by_name("trk")
    by_id = {r.data.tags["asyncsync.run_id"]: r
             for r in client.search_runs([experiment.experiment_id])}
    assert len(by_id) == 4
    for run_dir in run_dirs_of(root):
        run = by_id[f"trk/{root.name}/{run_dir.name}"]
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "accuracy")
        assert sorted({m.step for m in history}) == sorted(
            {v for v, _, _ in evaluations(run_dir)})


def test_a_slurm_array_is_tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's local executor (no srun on the PATH) runs the array's tasks here."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    pytest.importorskip("submitit", reason="submitit not installed (the slurm extra)")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    root = run_study(tmp_path, "--executor", "slurm", "--slurm-time", "10",
                     "--track", f"tensorboard={tmp_path / 'tb'}")
    assert_tensorboard_has_every_run(tmp_path / "tb", root)
