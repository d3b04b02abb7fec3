"""Summaries, tables, CSV and plots rebuilt from log files alone."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync.results import plots, pyplot, timeline
from asyncsync.results.report import publish, summarize_run
from asyncsync.results.studies import find_reports
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import HELD, KEY, Kind
from asyncsync.study.executors import write_summary
from asyncsync.tracking.base import Point, RunInfo
from asyncsync.tracking.feed import RunFeed


def fake_run(root: Path, recipe: str, name: str, protocol: str, accuracies: list[float],
             compute_s: tuple[float, float] = (5.0, 8.0), repeat: int | None = None,
             old: bool = False) -> Path:
    """A finished run written by hand: its logs and the summary.json the runner writes
    last; `old`: workers' logs in the schema before `asyncsync.runlog.schema` (kind ``ev``,
    held time ``wait`` and ``wait_s``)."""
    run_dir = root / recipe / "20260101-000000" / (name if repeat is None else f"{name}-r{repeat}")
    run_dir.mkdir(parents=True)
    spec = {"name": name, "protocol": {"name": protocol}, "workers": 2, "seed": repeat or 0,
            "stop": {"target_accuracy": 0.5}}
    (run_dir / "recipe.json").write_text(json.dumps({"name": recipe, "baseline": name,
                                                     "repeat": repeat or 0, "runs": [spec]}))
    events = [{"event": "eval", "t": 2.0 * i, "version": 3 * i, "accuracy": a, "loss": 1.0}
              for i, a in enumerate(accuracies)]
    events.append({"event": "stop", "t": 10.0, "versions": 30, "mean_staleness": 1.5})
    (run_dir / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    kind, held, held_s = ("ev", "wait", "wait_s") if old else ("event", "held_s", "held_s")
    for rank, busy in enumerate(compute_s):
        records = [{kind: "compute", "t": 1.0 * i, "dur": 0.5, "steps": 1, "samples": 8,
                    "loss": 1.0} for i in range(10)]
        records.append({kind: "push", "t": 0.5, "dur": 0.3, held: 0.1, "up": 10, "down": 5})
        records.append({kind: "final", "steps": 10, "samples": 80, "compute_s": busy,
                        held_s: 0.1, "wall_s": 10.0, "bytes_up": 100, "bytes_down": 50})
        lines = "\n".join(json.dumps(r) for r in records)
        (run_dir / f"worker-{rank}.jsonl").write_text(lines + f'\n{{"{kind}": "comp')  # torn
    write_summary(run_dir, summarize_run(run_dir))
    return run_dir


def test_summary_from_logs(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", "fast", "asp", [0.1, 0.4, 0.6, 0.55])
    summary = summarize_run(run_dir)
    assert summary["time_to_target_s"] == 4.0
    assert summary["time_to_target_avg_s"] == 6.0  # (0.4 + 0.6 + 0.55) / 3 >= 0.5
    assert summary["best_accuracy"] == 0.6 and summary["final_accuracy"] == 0.55
    assert summary["compute_proportion_per_worker"] == [0.5, 0.8]
    assert summary["compute_proportion"] == 0.65
    assert summary["samples_per_s"] == 16.0
    assert summary["bytes_up"] == 200 and summary["versions"] == 30


def test_a_lucky_evaluation_does_not_make_the_smoothed_time_to_target(tmp_path: Path) -> None:
    """A spike above the target that falls back (non-IID data) counts as the first crossing
    but not in the moving average of 3 evaluations, which needs sustained accuracy."""
    run_dir = fake_run(tmp_path, "r", "spiky", "fedavg", [0.1, 0.7, 0.2, 0.45, 0.55, 0.6, 0.6])
    summary = summarize_run(run_dir)
    assert summary["time_to_target_s"] == 2.0
    assert summary["time_to_target_avg_s"] == 10.0  # mean(0.45, 0.55, 0.6) first >= 0.5


def test_report_across_recipes_writes_csv_and_plots(tmp_path: Path) -> None:
    slow = fake_run(tmp_path, "a", "slow", "bsp", [0.1, 0.2, 0.3, 0.5])
    fast = fake_run(tmp_path, "b", "fast", "asp", [0.1, 0.5, 0.6])
    (runs,), notes = find_reports([tmp_path / "a", fast])
    assert notes == []
    assert runs == [slow, fast]
    console = Console(record=True, width=200)
    files = publish(runs, [summarize_run(r) for r in runs], "a/slow", tmp_path / "out",
                    console)
    text = console.export_text()
    assert "a/slow" in text and "b/fast" in text and "3.00x" in text
    rows = list(csv.DictReader((tmp_path / "out" / "table.csv").open()))
    assert [r["run"] for r in rows] == ["slow", "fast"]
    assert float(rows[1]["speedup"]) == 3.0
    names = {f.name for f in files}
    assert {"table.csv", "accuracy.png", "compute_proportion.png", "timeline-a-slow.png",
            "timeline-b-fast.png"} <= names
    assert all(f.stat().st_size > 1000 for f in files if f.suffix == ".png")


def test_report_without_matplotlib_prints_the_table_and_a_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyplot, "matplotlib_available", lambda: False)
    run_dir = fake_run(tmp_path, "r", "only", "bsp", [0.2, 0.6])
    console = Console(record=True, width=200)
    files = publish([run_dir], [summarize_run(run_dir)], "only", tmp_path / "out", console)
    assert [f.name for f in files] == ["table.csv"]
    text = console.export_text()
    assert "only" in text and 'pip install -e ".[plot]"' in text


def test_speedup_is_a_lower_bound_when_the_baseline_never_reaches_the_target(
        tmp_path: Path) -> None:
    base = fake_run(tmp_path, "r", "slow", "bsp", [0.1, 0.2, 0.3])  # never 0.5; wall 10 s
    fast = fake_run(tmp_path, "q", "fast", "asp", [0.1, 0.2, 0.6])  # 0.5 reached at 4 s
    console = Console(record=True, width=200)
    publish([base, fast], [summarize_run(base), summarize_run(fast)], "r/slow",
            tmp_path / "out", console)
    assert ">=2.50x" in console.export_text()
    rows = list(csv.DictReader((tmp_path / "out" / "table.csv").open()))
    assert rows[1]["speedup"] == "2.5" and rows[1]["speedup_is_lower_bound"] == "True"
    assert rows[0]["speedup"] == ""


def test_repeats_give_one_row_per_run_with_95_percent_intervals(tmp_path: Path) -> None:
    base_curves = [[0.1, 0.2, 0.3, 0.5], [0.1, 0.2, 0.3, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5]]
    fast_curves = [[0.1, 0.5, 0.6], [0.1, 0.2, 0.5], [0.1, 0.2, 0.5]]
    runs = [fake_run(tmp_path, "r", "slow", "bsp", curve, repeat=k)
            for k, curve in enumerate(base_curves)]
    runs += [fake_run(tmp_path, "r", "fast", "asp", curve, repeat=k)
             for k, curve in enumerate(fast_curves)]
    console = Console(record=True, width=250)
    publish(runs, [summarize_run(r) for r in runs], "slow", tmp_path / "out", console,
            title="r")
    text = console.export_text()
    # times to 0.5: slow 6, 6, 8 s; fast 2, 4, 4 s; paired speedups 3, 1.5, 2
    t = 4.303  # Student's t, 2 degrees of freedom, 97.5 %
    slow_half = t * statistics.stdev([6, 6, 8]) / 3 ** 0.5
    speed_half = t * statistics.stdev([3, 1.5, 2]) / 3 ** 0.5
    assert f"6.7±{slow_half:.1f}" in text and f"2.17x±{speed_half:.2f}" in text
    assert "over 3 repeats" in text
    rows = list(csv.DictReader((tmp_path / "out" / "table.csv").open()))
    assert [(r["run"], r["repeat"], r["seed"]) for r in rows] == [
        ("slow", "0", "0"), ("slow", "1", "1"), ("slow", "2", "2"),
        ("fast", "0", "0"), ("fast", "1", "1"), ("fast", "2", "2")]
    assert [float(r["speedup"]) for r in rows[3:]] == [3.0, 1.5, 2.0]
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 1000


def summary(run: str, protocol: str, repeat: int, ttt: float | None, **extra: object
            ) -> dict[str, object]:
    return {"recipe": "esync", "run": run, "protocol": protocol, "repeat": repeat,
            "seed": repeat, "sweep": {}, "wall_s": 300.0, "target_accuracy": 0.7,
            "time_to_target_s": ttt, "time_to_target_avg_s": ttt, "best_accuracy": 0.9234,
            "final_accuracy": 0.9012, "compute_proportion": 0.4567, "samples_per_s": 12345.6,
            "bytes_up": 10**9, "bytes_down": 2 * 10**9, "mb_moved": 3000.0, "versions": 56789,
            "mean_staleness": 12.345, **extra}


@pytest.mark.parametrize("width", [80, 100, 150])
def test_the_table_fits_the_terminal_and_never_cuts_a_number(width: int) -> None:
    """The at-scale case: five repeats, long names, large speedups."""
    summaries = [summary("bsp@workers=16", "bsp", k, 100.0, sweep={"workers": 16})
                 for k in range(5)]
    summaries += [summary("esync@workers=16", "esync", k, t, sweep={"workers": 16})
                  for k, t in enumerate([1.25, 1.5, 1.25, 1.5, None])]
    console = Console(record=True, width=width, color_system=None)
    publish_table = __import__("asyncsync.results.report", fromlist=["comparison_table"])
    console.print(publish_table.comparison_table(summaries, "bsp", "esync", console.width))
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    # esync's speedups 80, 66.67, 80, 66.67 (4 of 5 reached the target)
    speedups = [80.0, 100 / 1.5, 80.0, 100 / 1.5]
    half = 3.182 * statistics.stdev(speedups) / 2  # t(3 dof), sqrt(4) = 2
    assert f"73.33x±{half:.2f} (4/5)" in text
    assert "1.4±0.2 (4/5)" in text  # time to 0.70: mean 1.375, half 3.182*0.144/2 = 0.23
    assert "0.923" in text and "12346" in text and "12.35" in text and "0.46" in text
    assert "esync@workers=16" in text and "bsp@workers=16" in text
    assert "t@0.70: seconds to the first evaluation >= 0.70" in " ".join(text.split())


def test_the_quickstart_table_is_one_row_per_run_in_80_columns() -> None:
    summaries = [summary("bsp", "bsp", 0, 20.0), summary("asp", "asp", 0, 6.0)]
    console = Console(record=True, width=80, color_system=None)
    publish_table = __import__("asyncsync.results.report", fromlist=["comparison_table"])
    console.print(publish_table.comparison_table(summaries, "bsp", "quickstart", 80))
    rows = [line.split() for line in console.export_text().splitlines()]
    assert ["asp", "asp", "6.0", "6.0", "0.923", "3.33x", "0.46", "12346", "12.35"] in rows


def test_a_table_without_a_target_has_no_target_columns() -> None:
    """No run set a target accuracy: no ``t@-`` column of dashes, and the legend says why."""
    summaries = [summary("bsp", "bsp", 0, None, target_accuracy=None),
                 summary("asp", "asp", 0, None, target_accuracy=None)]
    console = Console(record=True, width=100, color_system=None)
    publish_table = __import__("asyncsync.results.report", fromlist=["comparison_table"])
    console.print(publish_table.comparison_table(summaries, "bsp", "mine", 100))
    printed = console.export_text()
    rows = [line.split() for line in printed.splitlines()]
    assert ["run", "protocol", "best", "comp", "smp/s", "stale"] in rows
    text = " ".join(printed.split())
    assert "t@" not in text and "avg3" not in text
    assert "asp asp 0.923 0.46 12346 12.35" in text
    assert "no run set stop.target_accuracy" in text


def test_the_mean_of_repeats_that_stopped_at_the_target_reaches_it() -> None:
    """stop_at_target ends each repeat at its crossing: the first at 4 s, the second at 6 s."""
    group = [{"evaluations": [[0, 0.1], [2, 0.4], [4, 0.72]]},
             {"evaluations": [[0, 0.1], [3, 0.5], [6, 0.71]]}]
    times, curves = plots.repeat_curves(group)
    assert list(times) == [0, 2, 3, 4, 6]
    assert list(curves[0]) == [0.1, 0.4, 0.56, 0.72, 0.72]  # held after its end
    assert curves.mean(axis=0)[-1] >= 0.7


def test_virtual_runs_plot_virtual_time_and_no_plot_overwrites_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipe "a" run "b-c" and recipe "a-b" run "c" both make timeline-a-b-c.png."""
    one = fake_run(tmp_path, "a", "b-c", "bsp", [0.1, 0.6])
    two = fake_run(tmp_path, "a-b", "c", "asp", [0.6])
    summaries = [{**summarize_run(d), "clock": "virtual"} for d in (one, two)]
    labels: list[str] = []

    def fake_timeline(run_dir: Path, path: Path, name: str, clock: str) -> Path:
        labels.append(clock)
        path.write_text(name)
        return path

    monkeypatch.setattr(plots, "plot_timeline", fake_timeline)
    (tmp_path / "out").mkdir()
    files = plots.write_plots([one, two], summaries, tmp_path / "out")
    timelines = sorted(f.name for f in files if f.name.startswith("timeline"))
    assert timelines == ["timeline-a-b-c-2.png", "timeline-a-b-c.png"]
    assert labels == ["virtual", "virtual"]
    assert plots._clock(summaries) == "virtual" and plots._clock([{"clock": "real"}]) == "wall"


def test_runs_whose_evaluations_slipped_are_marked(tmp_path: Path) -> None:
    """Evaluations every 2 s were due; asp's came at 0, 2, 4, 8 s (one 2 s late)."""
    runs = {"bsp": [0.0, 2.0, 4.0, 6.0], "asp": [0.0, 2.0, 4.0, 8.0]}
    dirs = []
    for name, times in runs.items():
        run_dir = fake_run(tmp_path, "r", name, name, [0.1, 0.2, 0.3, 0.6])
        recipe = json.loads((run_dir / "recipe.json").read_text())
        recipe["runs"][0]["eval"] = {"interval_s": 2.0}
        (run_dir / "recipe.json").write_text(json.dumps(recipe))
        events = [{"event": "eval", "t": t, "version": 1, "accuracy": a, "loss": 1.0}
                  for t, a in zip(times, [0.1, 0.2, 0.3, 0.6], strict=True)]
        (run_dir / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
        dirs.append(run_dir)
    bsp, asp = (summarize_run(d) for d in dirs)
    assert (bsp["eval_interval_mean_s"], bsp["eval_interval_max_s"]) == (2.0, 2.0)
    assert bsp["eval_slipped"] is False
    assert (asp["eval_interval_mean_s"], asp["eval_interval_max_s"]) == (2.667, 4.0)
    assert asp["eval_slipped"] is True
    console = Console(record=True, width=150)
    publish(dirs, [bsp, asp], "bsp", tmp_path / "out", console)
    text = console.export_text()
    assert "asp*" in text and "bsp*" not in text
    assert "* evaluations slipped" in text
    rows = list(csv.DictReader((tmp_path / "out" / "table.csv").open()))
    assert [(r["eval_interval_max_s"], r["eval_slipped"]) for r in rows] == [
        ("2.0", "False"), ("4.0", "True")]


class PointRecorder:
    """A tracker that keeps the points and the summary it is sent."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.summary: dict[str, float] = {}

    def start(self, run: RunInfo) -> None:
        """Nothing to keep."""

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        self.points.append(point)

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        self.summary = summary

    def close(self) -> None:
        """Nothing to release."""


def test_old_logs_read_as_the_current_schema(tmp_path: Path) -> None:
    """Workers' logs written before the one schema (kind ``ev``, held time ``wait`` and
    ``wait_s``) give the same records, summary, timeline and tracker points as new ones."""
    accuracies = [0.1, 0.4, 0.6, 0.55]
    new = fake_run(tmp_path / "new", "r", "fast", "asp", accuracies)
    old = fake_run(tmp_path / "old", "r", "fast", "asp", accuracies, old=True)
    assert '"ev": "push"' in (old / "worker-0.jsonl").read_text()
    old_records = read_jsonl(old / "worker-0.jsonl")
    assert old_records == read_jsonl(new / "worker-0.jsonl")
    assert [r[KEY] for r in old_records[-2:]] == [Kind.PUSH, Kind.FINAL]
    assert old_records[-2][HELD] == 0.1 and old_records[-1][HELD] == 0.1
    assert summarize_run(old) == summarize_run(new)
    window = (0.0, 10.0)
    spans = timeline.timeline_spans(old_records, window)
    assert spans == timeline.timeline_spans(read_jsonl(new / "worker-0.jsonl"), window)
    ((start, length),) = spans["held"]  # a push: moved 0.2 s, then held
    assert start == pytest.approx(0.7) and length == 0.1
    fed = []
    for run_dir in (old, new):
        recorder = PointRecorder()
        RunFeed(run_dir, [recorder]).finish()
        assert recorder.points and recorder.summary
        fed.append((recorder.points, recorder.summary))
    assert fed[0] == fed[1]
    assert fed[0][0][1].metrics["compute_proportion/w0"] == 0.5  # the old computes counted
