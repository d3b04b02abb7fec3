"""Tracking: a small virtual study exported to TensorBoard, MLflow and W&B, read back with
each tool's own reader; the feed's incremental reading; ``--track`` specs."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncsync import cli
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.runner import run_recipe_file
from asyncsync.tracking import (
    Point,
    RunFeed,
    RunInfo,
    TrackingError,
    export_study,
    follow,
    parse_track,
)
from asyncsync.tracking.feed import figures, run_dirs_of
from asyncsync.tracking.tensorboard_tracker import TensorBoardTracker

RECIPE = """
name = "trk"
[defaults]
workers = 2
clock = "virtual"
[defaults.stop]
time_s = 2
target_accuracy = 0.5
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 16
[defaults.eval]
interval_s = 1.0
[defaults.compute]
slowdown = [1, 2]
base_step_s = 0.05
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 runs x 2 repeats, 2 s of virtual time each."""
    root = tmp_path_factory.mktemp("study")
    recipe = root / "trk.toml"
    recipe.write_text(RECIPE)
    summaries = run_recipe_file(recipe, [], [], root / "logs", live=False, repeats=2)
    assert not any("error" in s for s in summaries)
    (found,) = (root / "logs" / "trk").iterdir()
    return found


def evaluations(run_dir: Path) -> list[tuple[int, float, float]]:
    """(version, accuracy, time) of each evaluation in the run's events.jsonl."""
    return [(e["version"], e["accuracy"], e["t"])
            for e in read_jsonl(run_dir / "events.jsonl") if e.get(KEY) == Kind.EVAL]


def summary_of(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return summary


class Recorder:
    """A tracker that keeps what it is sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, run: RunInfo) -> None:
        self.calls.append(("start", run))

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        self.calls.append(("log", point))

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        self.calls.append(("finish", (summary, step)))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_the_study_has_four_runs_with_evaluations(study: Path) -> None:
    runs = run_dirs_of(study)
    assert sorted(r.name for r in runs) == ["asp-r0", "asp-r1", "bsp-r0", "bsp-r1"]
    assert all(len(evaluations(r)) >= 3 for r in runs)


def test_the_feed_sends_every_evaluation_and_the_summary(study: Path) -> None:
    recorder = Recorder()
    runs = export_study(study, [recorder])
    assert [r.run_id for r in runs] == [f"trk/{study.name}/{d.name}" for d in run_dirs_of(study)]
    assert recorder.calls[-1] == ("close", None)
    for run_dir, run in zip(run_dirs_of(study), runs, strict=True):
        assert (run.name, run.repeat, run.seed) == (
            run_dir.name[:3], int(run_dir.name[-1]), int(run_dir.name[-1]))
        assert run.config["protocol.name"] == run.name and "token" not in run.config
        assert run.group == f"trk/{study.name}/{run.name}"
    starts = [i for i, (kind, _) in enumerate(recorder.calls) if kind == "start"]
    for run_dir, at in zip(run_dirs_of(study), starts, strict=True):
        calls = recorder.calls[at + 1:]
        points = [p for kind, p in calls[:len(evaluations(run_dir))] if kind == "log"]
        assert [(p.step, p.metrics["accuracy"], p.time_s) for p in points] == \
            evaluations(run_dir)
        kind, (summary, step) = calls[len(points)]
        assert kind == "finish" and step == summary_of(run_dir)["versions"]
        assert summary == figures(summary_of(run_dir))
        assert summary["best_accuracy"] == summary_of(run_dir)["best_accuracy"]
        assert summary["compute_proportion/w1"] == \
            summary_of(run_dir)["compute_proportion_per_worker"][1]
        # per-worker figures at an evaluation come from the workers' logs up to its time
        last = points[-1].metrics
        assert 0 < last["compute_proportion/w0"] <= 1 and last["mb_moved"] > 0


def test_a_live_run_is_fed_incrementally_torn_lines_included(study: Path,
                                                             tmp_path: Path) -> None:
    source = run_dirs_of(study)[0]
    live = tmp_path / study.name / source.name
    shutil.copytree(source, live)
    events = (source / "events.jsonl").read_bytes()
    (live / "summary.json").unlink()
    whole = Recorder()
    RunFeed(source, [whole]).finish()
    part = Recorder()
    feed = RunFeed(live, [part])
    cut = events.index(b'"eval"', events.index(b'"eval"') + 1)  # inside the second eval
    (live / "events.jsonl").write_bytes(events[:cut])
    assert feed.poll() == 1
    assert feed.poll() == 0
    (live / "events.jsonl").write_bytes(events)
    assert feed.poll() == len(evaluations(source)) - 1
    (live / "summary.json").write_text((source / "summary.json").read_text())
    feed.finish()
    assert [c for c in part.calls if c[0] != "start"] == \
        [c for c in whole.calls if c[0] != "start"]


def test_follow_streams_a_run_while_it_is_written(study: Path, tmp_path: Path) -> None:
    source = run_dirs_of(study)[0]
    target = tmp_path / study.name / source.name
    lines = (source / "events.jsonl").read_text().splitlines(keepends=True)

    async def run() -> str:
        target.mkdir(parents=True)
        for name in ("recipe.json", "worker-0.jsonl", "worker-1.jsonl"):
            shutil.copy(source / name, target / name)
        for line in lines:
            with (target / "events.jsonl").open("a") as file:
                file.write(line)
            await asyncio.sleep(0.01)
        shutil.copy(source / "summary.json", target / "summary.json")
        return "done"

    recorder = Recorder()
    assert asyncio.run(follow(target, run(), [recorder], every_s=0.005)) == "done"
    points = [p for kind, p in recorder.calls if kind == "log"]
    assert [(p.step, p.metrics["accuracy"], p.time_s) for p in points] == evaluations(source)
    assert recorder.calls[-1][0] == "finish"


def test_track_specs() -> None:
    with pytest.raises(TrackingError, match=r"expected tensorboard\[=DIR\] \(default runs\), "
                       r"mlflow\[=URI\] \(default mlruns\) or wandb\[=PROJECT\]"):
        parse_track("neptune=x")
    # the place is optional, as the message says: the default folder
    tracker = parse_track("tensorboard")
    assert isinstance(tracker, TensorBoardTracker) and tracker.directory == Path("runs")


def test_a_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(TrackingError,
                       match=r"^tracking to wandb needs the wandb package: "
                             r"pip install asyncsync\[track\]$"):
        parse_track("wandb")


def test_tensorboard_reads_back_every_evaluation_and_summary(study: Path,
                                                             tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for _ in range(2):  # the second export replaces the first
        export_study(study, [parse_track(f"tensorboard={tmp_path}")])
    runs = sorted(p.relative_to(tmp_path).as_posix()
                  for p in tmp_path.rglob("r[0-9]") if p.is_dir())
    assert runs == [f"trk/{study.name}/{name}/r{k}" for name in ("asp", "bsp") for k in (0, 1)]
    for run_dir in run_dirs_of(study):
        name, repeat = run_dir.name.split("-")
        where = tmp_path / "trk" / study.name / name / repeat
        assert len(list(where.iterdir())) == 1  # one event file: no duplicate
        events = EventAccumulator(str(where), size_guidance={"scalars": 0})
        events.Reload()
        accuracy = events.Scalars("accuracy")
        expected = evaluations(run_dir)
        assert [s.step for s in accuracy] == [v for v, _, _ in expected]
        assert [s.value for s in accuracy] == pytest.approx([a for _, a, _ in expected])
        # the wall clock runs with the run's time: TensorBoard's Relative axis
        assert [s.wall_time - accuracy[0].wall_time for s in accuracy] == pytest.approx(
            [t for _, _, t in expected])
        summary = figures(summary_of(run_dir))
        for key, value in summary.items():
            (scalar,) = events.Scalars(f"summary/{key}")
            assert scalar.step == summary_of(run_dir)["versions"]
            assert scalar.value == pytest.approx(value, rel=1e-6)


def test_mlflow_reads_back_every_evaluation_and_summary(study: Path, tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (the track extra)")
    from asyncsync.tracking.mlflow_tracker import store_uri

    for _ in range(2):  # the second export finds the runs by their tag
        export_study(study, [parse_track(f"mlflow={tmp_path / 'store'}")])
    client = mlflow.MlflowClient(tracking_uri=store_uri(str(tmp_path / "store")))
    experiment = client.get_experiment_by_name("trk")
    tracked = client.search_runs([experiment.experiment_id])
    by_id = {r.data.tags["asyncsync.run_id"]: r for r in tracked}
    assert len(tracked) == len(by_id) == 4
    for run_dir in run_dirs_of(study):
        run = by_id[f"trk/{study.name}/{run_dir.name}"]
        name = run_dir.name.split("-")[0]
        assert run.data.tags["asyncsync.group"] == f"trk/{study.name}/{name}"
        assert run.data.tags["seed"] == run_dir.name[-1]
        assert run.data.params["protocol.name"] == name
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "accuracy")
        # MLflow keeps one row per (step, timestamp, value): the final evaluation repeats
        # the last scheduled one when both fall at the run's end
        assert sorted((m.step, m.timestamp, m.value) for m in history) == sorted(
            {(v, round((run.info.start_time / 1000 + t) * 1000), a)
             for v, a, t in evaluations(run_dir)})
        for key, value in figures(summary_of(run_dir)).items():
            (metric,) = client.get_metric_history(run.info.run_id, f"summary/{key}")
            assert (metric.step, metric.value) == (summary_of(run_dir)["versions"], value)


def inspect(run_dir: Path, *options: str) -> Any:
    """W&B's own reader of an offline run's transaction log (``wandb leet inspect``)."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    done = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", *options, str(run_dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"wandb leet inspect {run_dir.name}: {done.stderr}"
    out = done.stdout
    if options:
        return json.loads(out)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline, its config, cache and data under `tmp_path`/home (skips without it)."""
    pytest.importorskip("wandb", reason="wandb not installed (the track extra)")
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def test_wandb_offline_reads_back_every_evaluation_and_summary(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offline_wandb(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # the second export replaces each run's offline folder
        export_study(study, [parse_track("wandb=trk-project")])  # under ./wandb
    offline = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 4
    by_id = {}
    for folder in offline:
        records = inspect(folder)
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        by_id[run["config"]["update"]["run_id"]] = (run, records, inspect(folder, "--summary"))
    for run_dir in run_dirs_of(study):
        run, records, summary = by_id[f"trk/{study.name}/{run_dir.name}"]
        name = run_dir.name.split("-")[0]
        assert (run["project"], run["run_group"]) == ("trk-project", f"trk/{study.name}/{name}")
        assert run["run_id"] == f"trk-{study.name}-{run_dir.name}"
        assert f"seed={run_dir.name[-1]}" in run["tags"]
        assert summary["config"]["protocol.name"] == name
        rows = [r["history"]["item"] for r in records if r["type"] == "history"]
        assert [(row["version"], row["accuracy"], row["time_s"]) for row in rows] == \
            evaluations(run_dir)
        assert summary["state"] == "finished"
        for key, value in figures(summary_of(run_dir)).items():
            assert summary["summary"][key] == pytest.approx(value)
        assert summary["summary"]["version"] == summary_of(run_dir)["versions"]


def test_wandb_writes_each_run_under_the_folder_current_when_it_starts(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's service process keeps the folder it started in: a relative run folder would
    put a later study's transaction logs under an earlier study's folder."""
    offline_wandb(tmp_path, monkeypatch)
    for where in ("first", "second"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        export_study(study, [parse_track("wandb=trk-project")])
        logs = sorted((tmp_path / where / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(logs) == 4, f"{where}: {logs}"


def scalars(where: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tag in TensorBoard event files, through EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(where), size_guidance={"scalars": 0})
    events.Reload()
    return [(s.step, s.value) for s in events.Scalars(tag)]


def test_the_cli_streams_a_run_and_exports_a_study(study: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    recipe = tmp_path / "trk.toml"
    recipe.write_text(RECIPE)
    assert cli.main(["run", str(recipe), "--only", "asp", "--plain", "--logs",
                     str(tmp_path / "logs"), "--track", f"tensorboard={tmp_path / 'live'}"]) == 0
    (run_dir,) = run_dirs_of(tmp_path / "logs")
    (where,) = (tmp_path / "live").rglob("r0")
    assert where.relative_to(tmp_path / "live").as_posix() == \
        f"trk/{run_dir.parent.name}/asp/r0"
    streamed = scalars(where, "accuracy")
    assert [step for step, _ in streamed] == [v for v, _, _ in evaluations(run_dir)]
    assert [value for _, value in streamed] == pytest.approx(
        [a for _, a, _ in evaluations(run_dir)])
    assert cli.main(["report", str(study), "--track", f"tensorboard={tmp_path / 'later'}"]) == 0
    assert "tracked 4 runs: tensorboard=" in capsys.readouterr().out
    assert len(list((tmp_path / "later").rglob("events.out.tfevents.*"))) == 4


def test_the_cli_names_a_missing_package_in_one_line(
        study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert cli.main(["report", str(study), "--track", "mlflow"]) == 2
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "error: --track mlflow: needs the mlflow package: pip install asyncsync[track]")


def test_a_recipes_tracking_table_streams_its_runs(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed (the track extra)")
    recipe = tmp_path / "trk.toml"
    table = f'[tracking]\ntensorboard = "{tmp_path / "tb"}"'
    recipe.write_text(RECIPE.replace('name = "trk"', f'name = "trk"\n{table}'))
    assert cli.main(["run", str(recipe), "--only", "asp", "--plain", "--jobs", "1", "--logs",
                     str(tmp_path / "logs")]) == 0
    (run_dir,) = run_dirs_of(tmp_path / "logs")
    (where,) = (tmp_path / "tb").rglob("r0")
    assert [step for step, _ in scalars(where, "accuracy")] == [
        v for v, _, _ in evaluations(run_dir)]


@pytest.mark.parametrize(("table", "message"), [
    ('[tracking]\nneptune = "x"', "tracking.neptune: unknown tool (known: tensorboard"),
    ("[tracking]\nwandb = 3", "tracking.wandb: expected a string"),
])
def test_a_bad_tracking_table_is_named(tmp_path: Path, table: str, message: str) -> None:
    recipe = tmp_path / "trk.toml"
    recipe.write_text(RECIPE.replace('name = "trk"', f'name = "trk"\n{table}'))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(recipe)
