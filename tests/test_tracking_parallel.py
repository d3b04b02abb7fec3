"""Tracking a study whose runs go in parallel (``--jobs 2``) to MLflow (tests/test_parallel.py
tracks its parallel study and its Slurm array to TensorBoard and W&B)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync import cli
from asyncsync.tracking.feed import run_dirs_of
from tests.test_tracking import RECIPE, evaluations


def test_parallel_runs_are_each_tracked_in_mlflow(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (the track extra)")
    from asyncsync.tracking.mlflow_tracker import store_uri

    recipe = tmp_path / "trk.toml"
    recipe.write_text(RECIPE)
    assert cli.main(["run", str(recipe), "--plain", "--repeats", "2", "--logs",
                     str(tmp_path / "logs"), "--jobs", "2", "--track",
                     f"mlflow={tmp_path / 'store'}"]) == 0
    (root,) = (tmp_path / "logs" / "trk").iterdir()
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
