"""Availability: traces, generators, and workers that go offline and come back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from asyncsync.hetero.availability import (
    OnlineTimes,
    all_offline,
    diurnal_availability,
    exponential_availability,
    load_availability,
    write_availability,
)
from asyncsync.hetero.traces import TraceError
from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from asyncsync.study.specs import RunSpec

RECIPE = """
name = "avail"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 20
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 8
[defaults.eval]
interval_s = 5.0
[defaults.compute]
base_step_s = 0.1
[defaults.availability]
trace = "{trace}"
[[runs]]
name = "run"
protocol = "{protocol}"
"""


def write_trace(path: Path, rows: str) -> Path:
    path.write_text("worker,online_from_s,online_to_s\n" + rows)
    return path


def spec_of(tmp_path: Path, trace: Path, protocol: str = "bsp") -> RunSpec:
    recipe = tmp_path / "avail.toml"
    recipe.write_text(RECIPE.format(trace=trace, protocol=protocol))
    return load_recipe(recipe).run("run")


def simulated(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "avail", "baseline": spec.name, "runs": [spec.as_table()]}))
    facts = simulate(spec, run_dir, f"avail/{spec.name}")
    return {**summarize_run(run_dir), **facts}


# ---- the trace format ---------------------------------------------------------------------
def test_a_trace_gives_each_worker_its_intervals_and_none_means_never(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", "# a comment\n0,0,300\n0,900,1400\n1,10,20\n"
                                            "1,20,30\n")
    times = load_availability(trace, 3)
    assert times[0].intervals == ((0, 300), (900, 1400))
    assert times[1].intervals == ((10, 30),)  # touching intervals merge
    assert times[2].intervals == ()  # no rows: never online
    assert times[0].online_at(299.9) and not times[0].online_at(300)
    assert times[0].offline_at(100) == 300 and times[0].online_from(300) == 900
    assert times[0].online_from(1400) is None


@pytest.mark.parametrize(("rows", "line", "problem"), [
    ("0,0,10\n5,0,10\n", 3, "unknown worker 5"),
    ("0,-5,10\n", 2, "negative interval"),
    ("0,0,10\n0,5,20\n", 3, "overlaps"),
    ("0,10,10\n", 2, "empty interval"),
    ("0,abc,10\n", 2, "is not a number"),
    ("0,1\n", 2, "2 fields"),
    ("", 1, "no rows after the header"),  # would be every worker offline all run
    ("# worker 0 is never online\n", 1, "no rows after the header"),
])
def test_a_bad_trace_names_the_file_the_line_and_the_problem(
        tmp_path: Path, rows: str, line: int, problem: str) -> None:
    trace = write_trace(tmp_path / "bad.csv", rows)
    with pytest.raises(TraceError) as caught:
        load_availability(trace, 3)
    assert str(caught.value).startswith(f"{trace}:{line}: ")
    assert problem in str(caught.value)


def test_a_bad_trace_in_a_recipe_is_one_error_line_with_exit_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncsync import cli

    trace = write_trace(tmp_path / "bad.csv", "0,0,10\n7,0,10\n")
    recipe = tmp_path / "avail.toml"
    recipe.write_text(RECIPE.format(trace=trace, protocol="bsp"))
    assert cli.main(["check", str(recipe)]) == 2
    err = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error:")
    assert f"{trace}:3: unknown worker 7" in err[0]
    with pytest.raises(ConfigError):
        load_recipe(recipe)


# ---- generators ---------------------------------------------------------------------------
def test_exponential_periods_have_their_means_and_the_seed_fixes_them() -> None:
    times = exponential_availability(400, 100.0, 300.0, 20_000.0, seed=3)
    assert times == exponential_availability(400, 100.0, 300.0, 20_000.0, seed=3)
    assert times != exponential_availability(400, 100.0, 300.0, 20_000.0, seed=4)
    share = sum(t.online_s(20_000) for t in times) / (400 * 20_000)
    assert share == pytest.approx(0.25, abs=0.02)  # on / (on + off)
    inner = [b - a for t in times for a, b in t.intervals if a > 0 and b < 20_000]
    assert sum(inner) / len(inner) == pytest.approx(100.0, rel=0.1)


def test_diurnal_windows_are_one_a_day_of_the_fraction_asked() -> None:
    day = 1000.0
    times = diurnal_availability(50, day, 0.25, 0.0, 10 * day, seed=1)
    for worker in times:
        inner = [b - a for a, b in worker.intervals if a > 0 and b < 10 * day]
        assert all(length == pytest.approx(250.0) for length in inner)
        assert worker.online_s(10 * day) == pytest.approx(2500.0, abs=250.0)
    phases = {round(t.intervals[1][0] % day) for t in times}
    assert len(phases) > 40  # spread over the day


def test_a_written_trace_reads_back_the_same(tmp_path: Path) -> None:
    times = exponential_availability(5, 50.0, 50.0, 500.0, seed=0)
    write_availability(tmp_path / "t.csv", times, "generated")
    again = load_availability(tmp_path / "t.csv", 5)
    for mine, read in zip(times, again, strict=True):
        assert [(round(a, 3), round(b, 3)) for a, b in mine.intervals] == list(read.intervals)


def test_all_offline_finds_the_spans_without_anyone() -> None:
    times = [OnlineTimes(((0.0, 10.0), (30.0, 40.0))), OnlineTimes(((5.0, 12.0),))]
    assert all_offline(times, 50.0) == [(12.0, 30.0), (40.0, 50.0)]
    assert all_offline([OnlineTimes(())], 5.0) == [(0.0, 5.0)]


# ---- runs ---------------------------------------------------------------------------------
def test_an_offline_worker_sends_nothing_and_rounds_close_without_it(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", "0,0,20\n1,0,20\n2,0,5\n2,12,20\n")
    spec = spec_of(tmp_path, trace)
    summary = simulated(spec, tmp_path / "run")
    records = read_jsonl(tmp_path / "run" / "worker-2.jsonl")
    sent = [r for r in records if r[KEY] in (Kind.PUSH, Kind.PULL, Kind.EXCHANGE, Kind.JOIN)]
    # a request's record is stamped when it began: none in the offline span
    assert sent and not [r for r in sent if 5.0 < r["t"] < 12.0]
    assert [r["t"] for r in records if r[KEY] == Kind.OFFLINE] == [5.0]
    assert [r[KEY] for r in records if r[KEY] in (Kind.OFFLINE, Kind.ONLINE)] == [
        Kind.OFFLINE, Kind.ONLINE]
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["worker"] for e in events if e[KEY] == Kind.REJOIN] == [2]
    # bsp went on without worker 2: versions advanced while it was away
    steps_0 = read_jsonl(tmp_path / "run" / "worker-0.jsonl")
    versions_away = {r.get("version") for r in steps_0 if r[KEY] == Kind.EXCHANGE
                     and 6.0 < r["t"] < 11.0}
    assert len(versions_away) > 5
    share = summary["availability"]["mean_online_share"]
    assert share == pytest.approx((20 + 20 + 13) / 60, abs=1e-4)


def test_an_interval_that_ends_while_the_worker_leaves_is_skipped(tmp_path: Path) -> None:
    """Worker 0's leave waits for its slow uplink past the end of its 20 ms blip online:
    it used to log `online` after the blip had ended, then join and download the model
    while offline."""
    trace = write_trace(tmp_path / "t.csv", "0,0,5.2\n0,5.3,5.32\n0,8,20\n1,0,20\n2,0,20\n")
    links = tmp_path / "cap.csv"
    links.write_text("worker,s_per_sample,up_mbps,down_mbps\n0,0.001,20,40\n"
                     "1,0.002,10,20\n2,0.004,5,10\n")
    recipe = tmp_path / "avail.toml"
    recipe.write_text(f"""name = "avail"
[defaults]
workers = 3
clock = "virtual"
stop = {{time_s = 12}}
model = {{name = "mlp"}}
data = {{batch_size = 16}}
eval = {{interval_s = 4}}
availability = {{trace = "{trace}"}}
capacity = {{trace = "{links}"}}
[[runs]]
name = "run"
protocol = {{name = "fedavg", local_steps = 2, fraction = 1.0}}
""")
    simulated(load_recipe(recipe).run("run"), tmp_path / "run")
    times = load_availability(trace, 3)[0]
    records = read_jsonl(tmp_path / "run" / "worker-0.jsonl")
    online = [r["t"] for r in records if r[KEY] == Kind.ONLINE]
    assert online == [8.0]
    joins = [r["t"] for r in records if r[KEY] == Kind.JOIN]
    assert joins and all(times.online_at(t) for t in joins)
    assert [(r["t"], r["until"]) for r in records if r[KEY] == Kind.OFFLINE] == [(5.2, 8.0)]
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["t"] for e in events if e[KEY] == Kind.REJOIN and e["worker"] == 0] == [
        pytest.approx(8.0, abs=0.2)]


@pytest.mark.parametrize("protocol", ["fedavg", "asp"])
def test_a_trace_with_everyone_offline_pauses_and_the_run_ends_at_its_budget(
        tmp_path: Path, protocol: str) -> None:
    trace = write_trace(tmp_path / "t.csv", "0,0,4\n0,9,20\n1,0,3\n1,10,20\n2,0,4\n")
    summary = simulated(spec_of(tmp_path, trace, protocol), tmp_path / "run")
    assert summary["wall_s"] == pytest.approx(20.0, abs=0.5)
    assert summary["availability"]["all_offline_spans"] == [[4.0, 9.0]]
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert sorted(e["worker"] for e in events if e[KEY] == Kind.REJOIN) == [0, 1]
    late = [r for r in read_jsonl(tmp_path / "run" / "worker-0.jsonl")
            if r[KEY] in (Kind.PUSH, Kind.EXCHANGE) and r["t"] > 9.5]
    assert late  # training resumed after the pause


async def test_on_the_real_clock_a_worker_leaves_over_http_and_rejoins(
        tmp_path: Path) -> None:
    import asyncio
    import math

    from asyncsync.engine.settings import ServerSettings
    from asyncsync.engine.worker import Worker
    from asyncsync.runlog.metrics import JsonlLog
    from asyncsync.transport.http_server import ParameterServer
    from tests.helpers import batches_of, tiny_data, tiny_model

    x, y = tiny_data()
    server = ParameterServer(tiny_model(), "asp", 2,
                             ServerSettings(lr=0.1, time_s=2.5, eval_interval_s=1.0),
                             test_data=(x, y), events=JsonlLog(tmp_path / "events.jsonl"))
    url = await server.start()
    away = OnlineTimes(((0.0, 0.5), (1.5, math.inf)))
    try:
        nodes = [Worker.connect(rank, url, tiny_model(), batches_of(x, y, rank), "asp",
                                lr=0.1, batch_size=16, heartbeat_s=0.2,
                                availability=away if rank == 1 else None,
                                log_path=tmp_path / f"worker-{rank}.jsonl")
                 for rank in range(2)]
        finals = await asyncio.gather(*(node.run() for node in nodes))
        await server.wait_finished()
    finally:
        await server.close()
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [e["worker"] for e in events if e[KEY] == Kind.REJOIN] == [1]
    records = read_jsonl(tmp_path / "worker-1.jsonl")
    assert [r[KEY] for r in records if r[KEY] in (Kind.OFFLINE, Kind.ONLINE)] == [
        Kind.OFFLINE, Kind.ONLINE]
    went = next(r["t"] for r in records if r[KEY] == Kind.OFFLINE)
    back = next(r["t"] for r in records if r[KEY] == Kind.ONLINE)
    assert went >= 0.5 and back >= 1.5  # (a loaded host wakes late, never early)
    assert not [r for r in records if r[KEY] in (Kind.PUSH, Kind.PULL, Kind.EXCHANGE,
                                                 Kind.COMPUTE) and went < r["t"] < back]
    assert finals[0]["steps"] > finals[1]["steps"] > 0  # it computed only while online


@pytest.mark.parametrize(("keys", "problem"), [
    ('period_s = 600\nonline_fraction = 0.25', "period_s is only used with generator = "
                                               "\"diurnal\" (generator is \"\")"),
    ('generator = "diurnal"\nmean_online_s = 60', "mean_online_s is only used with "
                                                  "generator = \"exponential\""),
    ('generator = "exponential"\njitter_s = 30', "jitter_s is only used with generator = "
                                                 "\"diurnal\""),
])
def test_a_generator_key_that_nothing_uses_is_refused(tmp_path: Path, keys: str,
                                                      problem: str) -> None:
    """A diurnal day set without ``generator = "diurnal"`` left every worker online
    throughout, with no word of it."""
    recipe = tmp_path / "avail.toml"
    recipe.write_text(RECIPE.format(trace="", protocol="bsp").replace(
        'trace = ""', keys))
    with pytest.raises(ConfigError, match=r"defaults\.availability: .*" + re.escape(problem)):
        load_recipe(recipe)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("keys", "problem"), [
    ('generator = "exponential"\nmean_online_s = 1e-6\nmean_offline_s = 1e-6',
     "the exponential generator would draw about 60,000,000 periods"),
    ('generator = "diurnal"\nperiod_s = 1e-6', "the diurnal generator would draw about "
                                               "60,000,006 periods"),
    ('generator = "exponential"\nmean_online_s = inf', "mean_online_s: must be a finite "
                                                       "number, got inf"),
    ('generator = "diurnal"\njitter_s = inf', "jitter_s: must be a finite number, got inf"),
])
def test_a_generator_that_cannot_draw_a_usable_population_is_refused_at_once(
        tmp_path: Path, keys: str, problem: str) -> None:
    """Means or days of microseconds drew tens of millions of periods (the recipe check
    hung); an infinite mean or jitter drew NaN shares and windows."""
    recipe = tmp_path / "avail.toml"
    recipe.write_text(RECIPE.format(trace="", protocol="bsp").replace('trace = ""', keys))
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_recipe(recipe)


STRAGGLER_PAIR = """name = "pair"
[defaults]
workers = 2
clock = "virtual"
stop = {time_s = 6}
model = {name = "mlp"}
data = {batch_size = 8}
eval = {interval_s = 3}
compute = {base_step_s = 0.05, slowdown = [1, 50]}
[[runs]]
name = "run"
protocol = {name = "fedavg", local_steps = 2, fraction = 1.0}
"""
"""FedAvg over a worker and one 50x slower, for 6 virtual seconds."""


def straggler_pair(tmp_path: Path) -> dict[str, Any]:
    """`STRAGGLER_PAIR` run in `tmp_path`/run: its summary and facts."""
    recipe = tmp_path / "pair.toml"
    recipe.write_text(STRAGGLER_PAIR)
    return simulated(load_recipe(recipe).run("run"), tmp_path / "run")


def test_a_request_held_at_a_barrier_when_the_run_stops_is_logged_as_held(
        tmp_path: Path) -> None:
    """Worker 0's last exchange waits at the barrier for worker 1 (50x slower) until the
    run's end: it was logged as 0 s held, its whole wait counted as communication."""
    straggler_pair(tmp_path)
    records = read_jsonl(tmp_path / "run" / "worker-0.jsonl")
    last = [r for r in records if r[KEY] == Kind.EXCHANGE][-1]
    assert last["t"] + last["dur"] >= 6.0  # answered by the stop
    assert last["held_s"] > 0.8 * last["dur"] > 0.5
    final = next(r for r in records if r[KEY] == Kind.FINAL)
    assert final["held_s"] >= last["held_s"] - 1e-3
    assert final["comm_s"] < 0.2 * final["wall_s"]


def test_a_workers_wall_time_ends_when_it_learns_of_the_stop(tmp_path: Path) -> None:
    """Documented (docs/results.md): a step under way at the stop is finished and counted,
    so the slow worker's wall_s passes the 6 s budget; it ends with the request the stop
    answered, and its shares still add up to at most its wall time."""
    summary = straggler_pair(tmp_path)
    assert summary["wall_s"] == pytest.approx(6.0)
    records = read_jsonl(tmp_path / "run" / "worker-1.jsonl")
    final = next(r for r in records if r[KEY] == Kind.FINAL)
    last = [r for r in records if r[KEY] in (Kind.EXCHANGE, Kind.PUSH, Kind.PULL)][-1]
    assert last["version"] is None  # answered by the stop
    assert final["wall_s"] == pytest.approx(last["t"] + last["dur"], abs=1e-3)
    assert final["wall_s"] > 6.0  # its second step (5 s) began at 5 s, before the stop
    assert final["compute_s"] + final["comm_s"] + final["held_s"] <= final["wall_s"] + 1e-6
