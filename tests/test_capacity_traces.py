"""Device-capacity traces and FedScale's pickles: read safely, converted to CSV, used."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
from rich.console import Console

from asyncsync import cli
from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.capacity import Capacity, assign_rows, load_capacity
from asyncsync.hetero.fedscale import read_plain_pickle
from asyncsync.hetero.traces import TraceError
from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import final_records
from asyncsync.study.assembly import worker_link
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

CAPACITY = "worker,s_per_sample,up_mbps,down_mbps\n"


@pytest.mark.parametrize(("rows", "line", "problem"), [
    ("0,0.01,5,10\n1,0,5,10\n", 3, "zero or negative speed"),
    ("0,0.01,0,10\n", 2, "zero or negative bandwidth"),
    ("0,0.01,5,10\n0,0.02,5,10\n", 3, "worker 0 repeats line 2"),
    ("x,0.01,5,10\n", 2, "is not an integer"),
    ("", 1, "no rows after the header"),  # named line 2, which is not there
])
def test_a_bad_capacity_trace_names_the_file_the_line_and_the_problem(
        tmp_path: Path, rows: str, line: int, problem: str) -> None:
    path = tmp_path / "cap.csv"
    path.write_text(CAPACITY + rows)
    with pytest.raises(TraceError, match=rf"^{path}:{line}: .*{problem}"):
        load_capacity(path)


def test_rows_go_by_rank_when_they_cover_the_ranks_else_are_drawn_with_the_seed() -> None:
    rows = [Capacity(i, 0.01 * (i + 1), None, 1.0, 1.0) for i in range(4)]
    assert [r.row for r in assign_rows(rows, 3, seed=0)] == [0, 1, 2]
    drawn = assign_rows(rows, 10, seed=5)
    assert [r.row for r in drawn] == [r.row for r in assign_rows(rows, 10, seed=5)]
    assert [r.row for r in drawn] != [r.row for r in assign_rows(rows, 10, seed=6)]
    shifted = [Capacity(100 + i, 0.01, None, 1.0, 1.0) for i in range(8)]
    picked = [r.row for r in assign_rows(shifted, 5, seed=1)]
    assert len(set(picked)) == 5  # enough rows: drawn without replacement


def test_the_plain_unpickler_reads_plain_data_and_refuses_any_other_object(
        tmp_path: Path) -> None:
    plain = {1: {"computation": 162.0, "communication": 5648.1}, "x": [1, (2.5, None, True)]}
    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps(plain))
    assert read_plain_pickle(good) == plain
    for index, hostile in enumerate([OrderedDict(a=1), {"a": {1, 2}}, {"a": b"bytes"},
                                     {"a": Path("/")}]):
        bad = tmp_path / f"bad{index}.pkl"
        bad.write_bytes(pickle.dumps(hostile, protocol=4))
        with pytest.raises(TraceError, match="refused"):
            read_plain_pickle(bad)


def test_a_pickle_that_would_run_code_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (marker.write_text, ("pwned",))

    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"a": Payload()}))
    with pytest.raises(TraceError, match="refused"):
        read_plain_pickle(bad)
    assert not marker.exists()


def test_convert_says_one_worker_and_one_client_in_the_singular(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "behave.pkl").write_bytes(pickle.dumps({3: {"active": [0], "inactive": [20],
                                                            "finish_time": 0}}))
    (tmp_path / "device.pkl").write_bytes(pickle.dumps({3: {"computation": 50,
                                                            "communication": 1000}}))
    assert cli.main(["traces", "convert", "behave", str(tmp_path / "behave.pkl"),
                     str(tmp_path / "a.csv"), "--horizon-s", "250"]) == 0
    assert cli.main(["traces", "convert", "capacity", str(tmp_path / "device.pkl"),
                     str(tmp_path / "c.csv")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a.csv: availability of 1 worker over 250 s" in out
    assert "c.csv: capacity of 1 client" in out and "1 clients" not in out


def test_fedscale_traces_convert_to_csv_traces_that_runs_read(tmp_path: Path) -> None:
    behave = {7: {"active": [0, 50], "inactive": [20, 80], "finish_time": 100,
                  "duration": 100},
              3: {"active": [10], "inactive": [30], "finish_time": 0}}
    device = {3: {"computation": 162.0, "communication": 5648.0},
              7: {"computation": 50, "communication": 1000}}
    (tmp_path / "behave.pkl").write_bytes(pickle.dumps(behave))
    (tmp_path / "device.pkl").write_bytes(pickle.dumps(device))
    assert cli.main(["traces", "convert", "behave", str(tmp_path / "behave.pkl"),
                     str(tmp_path / "a.csv"), "--horizon-s", "250"]) == 0
    assert cli.main(["traces", "convert", "capacity", str(tmp_path / "device.pkl"),
                     str(tmp_path / "c.csv")]) == 0
    times = load_availability(tmp_path / "a.csv", 2)
    assert times[0].intervals == ((10.0, 30.0),)  # client 3 first, not repeated
    assert times[1].intervals == ((0, 20), (50, 80), (100, 120), (150, 180), (200, 220))
    rows = load_capacity(tmp_path / "c.csv")
    # FedScale charges a training sample 3 inference latencies (its augmentation_factor)
    assert [(r.row, r.s_per_sample, r.up_mbps) for r in rows] == [(3, 0.486, 5.648),
                                                                   (7, 0.15, 1.0)]


def test_converting_a_hostile_pickle_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.pkl").write_bytes(pickle.dumps({1: OrderedDict()}))
    assert cli.main(["traces", "convert", "capacity", str(tmp_path / "x.pkl"),
                     str(tmp_path / "c.csv")]) == 2
    out = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(out) == 1 and out[0].startswith("error:") and "refused" in out[0]
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.parametrize(("behave", "options", "problem"), [
    ({7: {"active": [0, 50], "inactive": [20], "finish_time": 100}}, [],
     "client 7: 2 'active' times but 1 'inactive' ones"),
    ({7: {"active": [0], "inactive": [20], "finish_time": 100}}, ["--workers", "5"],
     "--workers 5: the trace has 1 clients"),
])
def test_a_behave_trace_that_does_not_say_what_was_asked_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], behave: dict[int, object],
        options: list[str], problem: str) -> None:
    """Not truncated to its shorter list, nor fewer workers than asked; the error names the
    file without a line number (a pickle has none)."""
    source = tmp_path / "behave.pkl"
    source.write_bytes(pickle.dumps(behave))
    assert cli.main(["traces", "convert", "behave", str(source), str(tmp_path / "a.csv"),
                     "--horizon-s", "100", *options]) == 2
    assert f"error: {source}: {problem}" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "a.csv").exists()


RECIPE = """
name = "cap"
[defaults]
workers = 5
clock = "virtual"
seed = 2
[defaults.stop]
time_s = 3
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 10
[defaults.eval]
interval_s = 1.0
[defaults.capacity]
trace = "{trace}"
[[runs]]
name = "run"
protocol = "asp"
"""


def test_a_capacity_trace_sets_step_times_and_links_and_the_summary_names_the_rows(
        tmp_path: Path) -> None:
    trace = tmp_path / "cap.csv"
    trace.write_text(CAPACITY + "10,0.001,8000,16000\n11,0.004,4000,9000\n")
    recipe = tmp_path / "cap.toml"
    recipe.write_text(RECIPE.format(trace=trace))
    spec = load_recipe(recipe).run("run")
    links = {(link.spec.uplink_mbps, link.spec.downlink_mbps) for rank in range(5)
             if (link := worker_link(spec, rank)) is not None}
    assert links == {(8000, 16000), (4000, 9000)}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "cap", "baseline": "run", "runs": [spec.as_table()]}))
    facts = simulate(spec, run_dir, "cap/run")
    rows = facts["capacity_rows"]
    assert len(rows) == 5 and set(rows) <= {10, 11}
    assert facts["trace_sha256"] == {str(trace): hashlib.sha256(trace.read_bytes()).hexdigest()}
    steps = {w["rank"]: w["step_s"] for w in facts["step_time"]}
    for rank, row in enumerate(rows):
        assert steps[rank] == pytest.approx((0.001 if row == 10 else 0.004) * 10)
    summarize_run(run_dir)
    done = final_records(run_dir)
    fast = [done[r]["steps"] for r in range(5) if rows[r] == 10]
    slow = [done[r]["steps"] for r in range(5) if rows[r] == 11]
    assert fast and slow and min(fast) > 3 * max(slow)  # 4x the speed; links far from binding


def test_the_summary_names_each_trace_by_its_digest_as_read(tmp_path: Path) -> None:
    """A run records the SHA-256 of its capacity and availability traces; a trace edited
    afterwards gives the next run another digest."""
    capacity, online = tmp_path / "cap.csv", tmp_path / "online.csv"
    capacity.write_text(CAPACITY + "0,0.001,8,16\n")
    online.write_text("worker,online_from_s,online_to_s\n0,0,3\n")
    recipe = tmp_path / "cap.toml"
    recipe.write_text(RECIPE.format(trace=capacity)
                      + f'[defaults.availability]\ntrace = "{online}"\n')
    digests = load_recipe(recipe).run("run").population().facts()["trace_sha256"]
    assert digests == {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
                       for path in (capacity, online)}
    online.write_text("worker,online_from_s,online_to_s\n0,0,2.5\n1,0,3\n")
    again = load_recipe(recipe).run("run").population().facts()["trace_sha256"]
    assert again[str(online)] == hashlib.sha256(online.read_bytes()).hexdigest()
    assert again[str(online)] != digests[str(online)]


def test_a_capacity_trace_refuses_another_source_of_speed(tmp_path: Path) -> None:
    trace = tmp_path / "cap.csv"
    trace.write_text(CAPACITY + "0,0.001,8,16\n")
    recipe = tmp_path / "cap.toml"
    recipe.write_text(RECIPE.format(trace=trace) + "[defaults.network]\nbandwidth_mbps = 5\n")
    with pytest.raises(ValueError, match=r"network\.bandwidth_mbps: capacity\.trace sets"):
        load_recipe(recipe)


def test_check_says_the_capacity_trace_sets_speeds_and_links(tmp_path: Path) -> None:
    """`check`'s row of a run with a capacity trace names the trace for its compute and
    its network (it showed 1x and no link), with the slowdowns and latency laid on it."""
    from asyncsync.study.describe import check_table

    trace = tmp_path / "cap.csv"
    trace.write_text(CAPACITY + "0,0.001,8,16\n")
    recipe = tmp_path / "cap.toml"
    recipe.write_text(RECIPE.format(trace=trace) + "[defaults.network]\nlatency_ms = 30\n"
                      "[defaults.compute]\nslowdown = [1, 2]\n")
    console = Console(width=200, record=True)
    console.print(check_table(load_recipe(recipe)))
    (row,) = [line.split() for line in console.export_text().splitlines()
              if line.split()[:1] == ["run"] and "asp" in line]
    assert row[3:9] == ["trace", "x", "1,2", "+3", "at", "1"] and row[9:11] == ["trace", "30ms"]


def test_the_shipped_study_traces_are_what_their_script_writes(tmp_path: Path) -> None:
    import importlib.util

    root = Path(__file__).resolve().parents[1] / "recipes" / "population"
    loader = importlib.util.spec_from_file_location("make_traces", root / "make_traces.py")
    assert loader is not None and loader.loader is not None
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    script.main(tmp_path)
    for name in ("capacity.csv", "availability.csv"):
        assert (tmp_path / name).read_bytes() == (root / name).read_bytes(), name
    spec = load_recipe(root / "study.toml").run("fedavg")
    facts = spec.population().facts()
    assert len(facts["capacity_rows"]) == 1000
    assert 0.02 < facts["availability"]["mean_online_share"] < 0.04  # about 30 online
